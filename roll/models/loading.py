"""Load the policy, the critic and the tokenizer from a local HF dir; never from the hub.

Every worker loads through these functions, so the tiny model and a user's real model take the
same path (`local_files_only=True`: a typo in `pretrain:` fails at once instead of downloading).
"""

from __future__ import annotations

import contextlib
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
    path: str | os.PathLike[str], dtype: DType = "float32", attn_implementation: str | None = None
) -> PreTrainedModel:
    """The policy (or reference) model; `attn_implementation` None lets transformers choose."""
    return AutoModelForCausalLM.from_pretrained(
        model_dir(path),
        dtype=torch_dtype(dtype),
        attn_implementation=attn_implementation,
        local_files_only=True,
    )


def load_value_model(
    path: str | os.PathLike[str], dtype: DType = "float32", seed: int | None = None
) -> PreTrainedModel:
    """A critic: `AutoModelForTokenClassification` with one label, whose body is the causal LM of
    `path` and whose `score` head (hidden -> 1, logits (B, T, 1)) is new.

    The head is initialised from `seed` without touching the global RNG, or from the global RNG
    when `seed` is None (the caller seeded it). Dropout before the head is off: values feed PPO
    targets and must not be noisy. A dir that already holds a critic (a checkpoint) keeps its head.
    """
    config = AutoConfig.from_pretrained(model_dir(path), num_labels=1, local_files_only=True)
    config.classifier_dropout = 0.0
    rng = torch.random.fork_rng(devices=[]) if seed is not None else contextlib.nullcontext()
    with rng:
        if seed is not None:
            torch.manual_seed(seed)
        return AutoModelForTokenClassification.from_pretrained(
            path, config=config, dtype=torch_dtype(dtype), local_files_only=True
        )
