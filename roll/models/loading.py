"""Load the policy, the critic and the tokenizer from a local HF dir; never from the hub.

Every worker loads through these functions, so the tiny model and a user's real model take the
same path (`local_files_only=True`: a typo in `pretrain:` fails at once instead of downloading).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
from typing import Any, Literal

import torch
import transformers
from transformers import (
    AutoConfig,
    AutoImageProcessor,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoModelForTokenClassification,
    AutoProcessor,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

DType = Literal["float32", "bfloat16", "float16"]
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


logger = logging.getLogger("roll")
FLASH_ATTENTION = ("fa2", "flash_attn", "flash_attention_2")
"""ROLL's spellings of flash attention and transformers' own."""


def resolve_attention(name: str | None, device: str | torch.device = "cpu") -> str | None:
    """The `attn_implementation` transformers gets: flash attention's spellings mean
    "flash_attention_2" where the flash-attn package is installed and the device is a GPU, else
    "sdpa" with one warning line; other names pass through (None: transformers chooses)."""
    if name not in FLASH_ATTENTION:
        return name
    if torch.device(device).type == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    why = "needs a CUDA GPU" if torch.device(device).type != "cuda" else "needs the flash-attn package"
    logger.warning("attn_implementation %r: flash attention %s; using sdpa", name, why)
    return "sdpa"


def resolve_dtype(name: str, device: str | torch.device = "cpu", training: bool = True) -> torch.dtype:
    """The dtype weights are loaded in on `device`: `name`'s, unless the device cannot train in it,
    then float32 with one warning line: float16 on CPU (no fp16 training kernels for every op, and
    no loss scaling here; `training=False`, a frozen model, keeps it), bfloat16 on a GPU without
    bf16 support (before Ampere)."""
    dtype = torch_dtype(name)
    kind = torch.device(device).type
    if dtype == torch.float16 and kind == "cpu" and training:
        logger.warning("dtype float16 cannot train on CPU; falling back to float32 (use bfloat16 or float32)")
        return torch.float32
    if dtype == torch.bfloat16 and kind == "cuda" and not torch.cuda.is_bf16_supported():
        logger.warning("dtype bfloat16 is not supported by this GPU; falling back to float32")
        return torch.float32
    return dtype


def model_dir(path: str | os.PathLike[str]) -> str:
    """`path` as a string if it is a model dir (has config.json), else a one-line error."""
    path = os.fspath(path)
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise FileNotFoundError(
            f"{path!r} is not a local model directory (no config.json); build the tiny model "
            "with `python -m roll.pipeline.tiny_model --output_dir DIR` or point to a downloaded HF model"
        )
    return path


def torch_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"dtype {name!r} is not one of {sorted(DTYPES)}")
    return DTYPES[name]


def load_tokenizer(path: str | os.PathLike[str]) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(model_dir(path), local_files_only=True)


def load_causal_lm(
    path: str | os.PathLike[str],
    dtype: DType = "float32",
    attn_implementation: str | None = None,
    device: str | torch.device = "cpu",
    training: bool = True,
) -> PreTrainedModel:
    """The policy (or reference) model with its weights in `dtype` (as ROLL loads them: weights,
    not autocast) and attention `attn_implementation` (None lets transformers choose), both as
    `device` can run them (`resolve_dtype`, `resolve_attention`). The model stays on CPU."""
    return AutoModelForCausalLM.from_pretrained(
        model_dir(path),
        dtype=resolve_dtype(dtype, device, training),
        attn_implementation=resolve_attention(attn_implementation, device),
        local_files_only=True,
    )


def load_value_model(
    path: str | os.PathLike[str],
    dtype: DType = "float32",
    seed: int | None = None,
    attn_implementation: str | None = None,
    device: str | torch.device = "cpu",
) -> PreTrainedModel:
    """A critic: `AutoModelForTokenClassification` with one label, whose body is the causal LM of
    `path` and whose `score` head (hidden -> 1, logits (B, T, 1)) is new.

    The head is initialised from `seed` without touching the global RNG, or from the global RNG
    when `seed` is None (the caller seeded it). Dropout before the head is off: values feed PPO
    targets and must not be noisy. A dir that already holds a critic (a checkpoint) keeps its head.
    `dtype` and `attn_implementation` as in `load_causal_lm`.
    """
    config = AutoConfig.from_pretrained(model_dir(path), num_labels=1, local_files_only=True)
    config.classifier_dropout = 0.0
    rng = torch.random.fork_rng(devices=[]) if seed is not None else contextlib.nullcontext()
    with rng:
        if seed is not None:
            torch.manual_seed(seed)
        return AutoModelForTokenClassification.from_pretrained(
            path,
            config=config,
            dtype=resolve_dtype(dtype, device),
            local_files_only=True,
            attn_implementation=resolve_attention(attn_implementation, device),
        )


def is_vl_model(path: str | os.PathLike[str]) -> bool:
    """Whether the model dir at `path` takes images: its config has a `vision_config`
    (Qwen2-VL, Qwen2.5-VL and most image-text-to-text models)."""
    config = AutoConfig.from_pretrained(model_dir(path), local_files_only=True)
    return getattr(config, "vision_config", None) is not None


VISION_TOKEN_KEYS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


def vision_token_ids(config: Any) -> list[int]:
    """The ids of a vision-language config's image/video placeholders and vision markers: ids
    the processor writes around images, which the policy must never generate (a generated
    placeholder has no image behind it). Empty for a text-only config."""
    if getattr(config, "vision_config", None) is None:
        return []
    return sorted({getattr(config, key) for key in VISION_TOKEN_KEYS if getattr(config, key, None) is not None})


def load_vl_model(
    path: str | os.PathLike[str],
    dtype: DType = "float32",
    attn_implementation: str | None = None,
    device: str | torch.device = "cpu",
    training: bool = True,
) -> PreTrainedModel:
    """A vision-language policy (`AutoModelForImageTextToText`: Qwen2.5-VL loads as
    `Qwen2_5_VLForConditionalGeneration`), loaded like `load_causal_lm`."""
    return AutoModelForImageTextToText.from_pretrained(
        model_dir(path),
        dtype=resolve_dtype(dtype, device, training),
        attn_implementation=resolve_attention(attn_implementation, device),
        local_files_only=True,
    )


def load_policy(path: str | os.PathLike[str], **kwargs: Any) -> PreTrainedModel:
    """`load_vl_model` for a model that takes images (`is_vl_model`), else `load_causal_lm`."""
    return load_vl_model(path, **kwargs) if is_vl_model(path) else load_causal_lm(path, **kwargs)


def _processor_class(path: str) -> type:
    """The processor class a model dir names: `processor_class` in processor_config.json, or (a hub
    Qwen2-VL / Qwen2.5-VL dir) in preprocessor_config.json or tokenizer_config.json."""
    for name in ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json"):
        file = os.path.join(path, name)
        if os.path.isfile(file):
            with open(file) as f:
                found = json.load(f).get("processor_class")
            if found:
                return getattr(transformers, found)
    raise ValueError(f"{path} names no processor class (processor_class in processor_config.json)")


def _chat_template(path: str, tokenizer: PreTrainedTokenizerBase) -> str | None:
    """The dir's chat template: chat_template.jinja, chat_template.json (older hub dirs keep the
    processor's template there), else the tokenizer's."""
    jinja, legacy = os.path.join(path, "chat_template.jinja"), os.path.join(path, "chat_template.json")
    if os.path.isfile(jinja):
        with open(jinja) as f:
            return f.read()
    if os.path.isfile(legacy):
        with open(legacy) as f:
            return json.load(f)["chat_template"]
    return tokenizer.chat_template


def image_only_processor_class(processor_cls: type) -> type:
    """`processor_cls` that may be built with `video_processor=None`.

    transformers builds a Qwen-VL processor only with its video processor, and the video
    processors need torchvision, which this project does not install (it breaks `import vllm`).
    Images never touch the video processor, so the processor's own code (`__call__`, the chat
    template, the image token expansion) runs unchanged; only videos are refused."""

    class ImageOnly(processor_cls):
        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    ImageOnly.__name__ = ImageOnly.__qualname__ = processor_cls.__name__
    return ImageOnly


def load_processor(path: str | os.PathLike[str]) -> Any:
    """The model's own processor (`AutoProcessor`). Without torchvision a Qwen-VL processor
    cannot build its video processor; then the same processor class is built from the dir's
    tokenizer, image processor and chat template without one (`image_only_processor_class`)."""
    path = model_dir(path)
    if importlib.util.find_spec("torchvision") is not None:
        return AutoProcessor.from_pretrained(path, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return image_only_processor_class(_processor_class(path))(
        image_processor=AutoImageProcessor.from_pretrained(path, local_files_only=True),
        tokenizer=tokenizer,
        video_processor=None,
        chat_template=_chat_template(path, tokenizer),
    )
