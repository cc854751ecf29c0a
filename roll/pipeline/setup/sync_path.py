"""Which way the actor's weights go to the engines in this run (`roll.distributed.weight_transfer`):
the facts `choose_sync_path` decides from, read from the config and the device plan."""

from __future__ import annotations

from roll.distributed.placement import DevicePlan
from roll.distributed.strategies.registry import canonical_name
from roll.distributed.weight_transfer import choose_sync_path


def sync_path(cfg, plan: DevicePlan) -> str:
    """`CUDA_IPC` when actor_train (one process, `torch`, no LoRA) and every `hf` engine share one
    GPU; `CPU_COPY` otherwise."""
    trainer = plan.processes["actor_train"]
    engines = plan.processes["actor_infer"]
    return choose_sync_path(
        (trainer[0].device, trainer[0].node_id),
        [(p.device, p.node_id) for p in engines],
        trainer_ranks=len(trainer),
        trainer_strategy=canonical_name(cfg.actor_train.strategy_args.strategy_name),
        lora=cfg.actor_train.model_args.lora is not None,
        engine_strategy=canonical_name(cfg.actor_infer.strategy_args.strategy_name),
    )
