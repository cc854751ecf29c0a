"""Load the policy, the critic and the tokenizer from a local HF dir; never from the hub.

Every worker loads through these functions, so the tiny model and a user's real model take the
same path (`local_files_only=True`: a typo in `pretrain:` fails at once instead of downloading).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
from typing import Literal

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
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
