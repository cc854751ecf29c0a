"""The strategy registry: ROLL's strategy names -> the engine class, imported only when chosen.

Keyed by ROLL's names (`hf_infer`, `vllm`, `sglang`, `torch_train`, `deepspeed_train`,
`fsdp2_train`, `megatron_train`) and our short aliases (`hf`, `torch`, `deepspeed`, `fsdp2`,
`megatron`); the config normalises ROLL's names to the short ones (`roll.configs.worker`), and
both resolve here. Classes are named as `module:attr` strings, so no strategy module imports its
siblings, and a process that only generates never imports the training stack (or vLLM, DeepSpeed,
megatron-core unless chosen). A new engine is one line in `TRAIN_STRATEGIES` or `INFER_STRATEGIES`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from roll.configs.worker import MEGATRON_FUSIONS
from roll.core.imports import import_object

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PreTrainedModel

    from roll.configs.worker import TrainingArgs
    from roll.distributed.dynamic_batching import TokenBudget
    from roll.distributed.strategies.base import TrainStrategy

_STRATEGIES = "roll.distributed.strategies"
TRAIN_STRATEGIES = {
    "torch_train": f"{_STRATEGIES}.torch_train:TorchTrainStrategy",
    "deepspeed_train": f"{_STRATEGIES}.deepspeed_train:DeepSpeedTrainStrategy",
    "fsdp2_train": f"{_STRATEGIES}.fsdp2_train:FSDP2TrainStrategy",
    "megatron_train": f"{_STRATEGIES}.megatron.train:MegatronTrainStrategy",
}
"""Training engines (actor_train, critic, reference) by ROLL's name."""
INFER_STRATEGIES = {
    "hf_infer": f"{_STRATEGIES}.hf.infer:HFInferStrategy",
    "vllm": f"{_STRATEGIES}.vllm_infer:VLLMInferStrategy",
    "sglang": f"{_STRATEGIES}.sglang_infer:SGLangInferStrategy",
}
"""Inference engines (actor_infer) by ROLL's name; all but `hf_infer` are built from a model dir."""
ALIASES = {
    "torch": "torch_train",
    "deepspeed": "deepspeed_train",
    "fsdp2": "fsdp2_train",
    "megatron": "megatron_train",
    "hf": "hf_infer",
    "megatron_infer": "megatron_train",
    "deepspeed_infer": "deepspeed_train",
    "fsdp2_infer": "fsdp2_train",
}
"""Our short names -> ROLL's; ROLL's forward-only `megatron_infer` / `deepspeed_infer` / `fsdp2_infer`
run the same engines as `megatron_train` / `deepspeed_train` / `fsdp2_train`."""


def canonical_name(name: str) -> str:
    """ROLL's name of strategy `name` (given in either spelling)."""
    return ALIASES.get(name, name)


def strategy_class(name: str, *, kind: str) -> type:
    """The engine class of `name` (`kind` "train" or "infer"), imported now; ValueError if unknown."""
    table = TRAIN_STRATEGIES if kind == "train" else INFER_STRATEGIES
    key = canonical_name(name)
    if key not in table:
        short = {v: k for k, v in ALIASES.items()}
        choices = ", ".join(short.get(k, k) for k in table)
        raise ValueError(
            f"unknown {'training' if kind == 'train' else 'inference'} strategy {name!r}; choose one of {choices}"
        )
    return import_object(table[key])


def build_train_strategy(
    model: PreTrainedModel,
    training_args: TrainingArgs,
    *,
    strategy_name: str = "torch",
    strategy_config: dict | None = None,
    total_steps: int,
    metric_prefix: str,
    device: str | torch.device = "cpu",
    dedupe_rows: bool = True,
    lora: dict | None = None,
    gradient_checkpointing: bool = False,
    train_budget: TokenBudget | None = None,
    infer_budget: TokenBudget | None = None,
    sequence_packing: bool = False,
) -> TrainStrategy:
    """The engine `strategy_name` around `model`, built from a `TrainingArgs` (roll.configs): the
    one place its fields are read. Engines other than `torch` are imported only when chosen.

    `lora` ({rank, alpha, target}, `ModelArgs.lora`) wraps the model in peft LoRA adapters first
    (megatron: adapters on its parallel layers, roll.distributed.strategies.megatron.lora);
    `gradient_checkpointing` recomputes activations in backward (HF's non-reentrant checkpointing,
    megatron's full-layer recompute); `train_budget` / `infer_budget` turn on dynamic batching (or
    are sequence packing's load-balanced plans); `sequence_packing` runs micro-batches as packed rows
    (every engine: megatron runs them in its packed "thd" format, roll.distributed.strategies.megatron.model).
    """
    megatron = canonical_name(strategy_name) == "megatron_train"
    if gradient_checkpointing and not megatron:
        # transformers 5's name for HF gradient checkpointing (`gradient_checkpointing_enable` is its alias)
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    trained: nn.Module = model  # what the engine trains: the HF model, or its peft LoRA wrapper
    if lora is not None and not megatron:  # megatron puts its own adapters on its parallel layers
        from roll.models.lora import apply_lora

        trained = apply_lora(model, **lora)
    kwargs = dict(
        learning_rate=training_args.learning_rate,
        weight_decay=training_args.weight_decay,
        adam_betas=(training_args.adam_beta1, training_args.adam_beta2),
        adam_epsilon=training_args.adam_epsilon,
        lr_scheduler_type=training_args.lr_scheduler_type,
        warmup_steps=training_args.warmup_for(total_steps),
        total_steps=total_steps,
        max_grad_norm=training_args.max_grad_norm,
        micro_batch_size=training_args.per_device_train_batch_size,
        metric_prefix=metric_prefix,
        device=device,
        dedupe_rows=dedupe_rows,
        train_budget=train_budget,
        infer_budget=infer_budget,
        sequence_packing=sequence_packing,
    )
    options = dict(strategy_config or {})
    engine_cls = strategy_class(strategy_name, kind="train")
    if canonical_name(strategy_name) == "deepspeed_train":
        return engine_cls(trained, ds_config=options, **kwargs)  # the options are a DeepSpeed config
    if megatron:  # its fused-kernel switches change no number and it runs unfused (MEGATRON_FUSIONS)
        options = {key: value for key, value in options.items() if key not in MEGATRON_FUSIONS}
        return engine_cls(trained, **options, recompute=gradient_checkpointing, lora=lora, **kwargs)
    return engine_cls(trained, **options, **kwargs)
