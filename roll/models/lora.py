"""LoRA adapters through peft: wrap a model, and hand its weights out merged, under HF names.

`apply_lora` freezes the model and adds peft LoRA adapters (A: r x in, B: out x r, B = 0 at the
start) on the target linear layers; only they train (and a critic's new value head, which peft
keeps as a full trainable copy, `modules_to_save`). Everything outside the strategy sees the
MERGED model: `merge_lora_state` turns the peft-named state dict into the base model's own names
with W + (alpha / r) * B @ A in every adapted layer, so inference engines and checkpoints get an
ordinary HF model. It is a pure function of a full state dict, so every strategy (torch, FSDP2,
DeepSpeed) merges the full tensors it already gathers, and the training model is never merged in
place (merging then unmerging would round the frozen base weights).
"""

from __future__ import annotations

import os

import torch
from torch import nn

ALL_LINEAR = ("all-linear", "all")
"""`lora_target` values meaning every linear layer but the output head (peft's `all-linear`)."""
ADAPTER = "default"
"""peft's adapter name; one adapter per model."""
_PEFT_PREFIX = "base_model.model."


def target_modules(target: str) -> str | list[str]:
    """`lora_target` as peft's `target_modules`: "all-linear", or the comma list's names."""
    if target.strip() in ALL_LINEAR:
        return "all-linear"
    return [name.strip() for name in target.split(",") if name.strip()]


def unmatched_target(module_names: list[str], target: str) -> str | None:
    """Why `target` does not fit a model with these module names (a listed name that is no
    module's last name part), or None when every name matches."""
    targets = target_modules(target)
    if targets == "all-linear":
        return None
    if not targets:
        return "lists no module name"
    leaves = {name.rsplit(".", 1)[-1] for name in module_names}
    missing = [name for name in targets if name not in leaves]
    if missing:
        return f"{missing[0]!r} matches no module of the model (e.g. q_proj, v_proj, or all-linear)"
    return None


def unmatched_lora_target(model_path: str | os.PathLike[str], target: str, value_model: bool = False) -> str | None:
    """`unmatched_target` for the model at `model_path`, built on the meta device from its config
    (nothing loaded), so a bad `lora_target` is caught before any worker starts."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

    config = AutoConfig.from_pretrained(os.fspath(model_path), local_files_only=True)
    auto = AutoModelForTokenClassification if value_model else AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(config)
    return unmatched_target([name for name, _ in model.named_modules()], target)


def apply_lora(model: nn.Module, *, rank: int, alpha: int, target: str) -> nn.Module:
    """`model` wrapped in a peft `PeftModel` with LoRA adapters on `target`; the base is frozen.

    A value model (`*ForTokenClassification`) keeps its `score` head fully trainable: it is new.
    A `target` that matches nothing raises ValueError (the config check says so earlier).
    """
    from peft import LoraConfig, get_peft_model

    missing = unmatched_target([name for name, _ in model.named_modules()], target)
    if missing:
        raise ValueError(f"lora_target: {missing}")
    value_model = type(model).__name__.endswith("ForTokenClassification")
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=0.0,
        target_modules=target_modules(target),
        modules_to_save=["score"] if value_model else None,
        bias="none",
    )
    return get_peft_model(model, config)


def lora_scaling(model: nn.Module) -> float | None:
    """alpha / r of a model from `apply_lora`, or None for a model without adapters."""
    config = getattr(model, "peft_config", {}).get(ADAPTER)
    return None if config is None else config.lora_alpha / config.r


def merge_lora_state(state: dict[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """A peft LoRA model's full state dict -> the merged model's, under the base model's names.

    `x.base_layer.weight` + scaling * `x.lora_B.default.weight` @ `x.lora_A.default.weight`
    becomes `x.weight` (computed in float32, stored in the base weight's dtype); a
    `modules_to_save` copy replaces its original; adapter tensors are dropped. Keys keep their order.
    """
    merged: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        name = key.removeprefix(_PEFT_PREFIX)
        if ".lora_" in name or ".original_module." in name:
            continue
        if ".base_layer." in name:
            layer, param = name.split(".base_layer.")
            if param == "weight" and f"{_PEFT_PREFIX}{layer}.lora_A.{ADAPTER}.weight" in state:
                a = state[f"{_PEFT_PREFIX}{layer}.lora_A.{ADAPTER}.weight"].float()
                b = state[f"{_PEFT_PREFIX}{layer}.lora_B.{ADAPTER}.weight"].float()
                value = (value.float() + scaling * (b @ a)).to(value.dtype)
            name = f"{layer}.{param}"
        name = name.replace(f".modules_to_save.{ADAPTER}.", ".")
        merged[name] = value
    return merged


def with_saved_adapter(state: dict[str, torch.Tensor], adapter: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` (a LoRA model's full state dict) with its adapter tensors replaced by `adapter`, a
    saved peft adapter (peft writes the keys without the adapter name). Every saved tensor must
    find its place: a mismatch (another model, another target) is a ValueError."""
    restored, used = dict(state), set()
    for key in state:
        # peft drops the adapter name, and a modules_to_save copy is saved under its module's name
        saved = key.replace(f".modules_to_save.{ADAPTER}.", ".").replace(f".{ADAPTER}.", ".")
        if saved in adapter:
            restored[key] = adapter[saved].to(state[key].dtype)
            used.add(saved)
    if used != set(adapter):
        raise ValueError(f"saved adapter does not fit the model: {sorted(set(adapter) - used)[0]}")
    return restored


def param_counts(model: nn.Module) -> dict[str, float]:
    """`model/trainable_params` and `model/total_params` (adapters included in the total)."""

    def numel(p: torch.Tensor) -> int:  # DeepSpeed ZeRO-3 empties partitioned parameters
        return int(getattr(p, "ds_numel", p.numel()))

    total = sum(numel(p) for p in model.parameters())
    trainable = sum(numel(p) for p in model.parameters() if p.requires_grad)
    return {"model/trainable_params": float(trainable), "model/total_params": float(total)}
