"""`deepspeed` training strategy: the `torch` strategy's step, with the model and optimizer owned by
a DeepSpeed engine (ZeRO stage 0-3 from `strategy_config`). Runs on CPU (gloo) and on GPUs.

`strategy_config` is a DeepSpeed config dict, as in ROLL (`zero_optimization: {stage: 3}`, offload,
bucket sizes...). The keys that `training_args` already decides (optimizer, schedule, micro-batch,
accumulation, clipping) are filled in here and may not be set there.

Contract: one `engine.step()` per mini-batch, exactly the torch strategy's optimizer step (the
accumulation boundary is set by hand, since the number of micro-batches varies); training forwards
go through the engine; a non-finite loss skips the update; `state_dict` gathers ZeRO-3's
partitions, so inference workers and checkpoints get full tensors. Unlike `torch`, under ZeRO 1-3
an update whose gradient norm is not finite (with a finite loss) has already been applied.

How a step maps onto DeepSpeed, and the CPU path's details: docs/engines/deepspeed.md.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from roll.distributed.strategies.offload import move_optimizer_state_
from roll.distributed.strategies.process_group import ensure_process_group
from roll.distributed.strategies.torch_train import TorchTrainStrategy, _as_float, restore_schedule

OWNED_KEYS = (
    "optimizer",
    "scheduler",
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "gradient_clipping",
)
"""DeepSpeed config keys that `training_args` decides (see module docstring)."""
CHECKPOINT_TAG = "deepspeed"
"""Subdirectory of a checkpoint with DeepSpeed's own files (partitioned optimizer state)."""


def _import_deepspeed():
    try:
        import deepspeed
    except ImportError:
        raise ImportError(
            'strategy "deepspeed" needs DeepSpeed: DS_BUILD_OPS=0 pip install "deepspeed>=0.19"'
        ) from None
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    return deepspeed


def _skip_shm_build(deepspeed) -> None:
    # By module name: `import deepspeed.comm.torch as m` binds the attribute `torch` of
    # deepspeed.comm, which is PyTorch itself (deepspeed.comm does `import torch`).
    comm_torch: Any = importlib.import_module("deepspeed.comm.torch")  # a module: its attributes untyped
    comm_torch.build_shm_op = lambda: None


def deepspeed_config(ds_config: dict[str, Any], *, micro_batch_size: int, max_grad_norm: float) -> dict[str, Any]:
    """The user's DeepSpeed config plus the keys we own; a clash is a one-line error."""
    clash = sorted(set(ds_config) & set(OWNED_KEYS))
    if clash:
        raise ValueError(f"strategy_config: {clash[0]!r} is set by training_args for the deepspeed strategy; remove it")
    stage = int(ds_config.get("zero_optimization", {}).get("stage", 0))
    return {
        "zero_optimization": {"stage": 0},
        "steps_per_print": 2**31 - 1,
        **ds_config,
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": 1,
        # Stage 0 has no ZeRO optimizer to clip and report the norm, so we clip ourselves.
        "gradient_clipping": max_grad_norm if stage > 0 else 0.0,
    }


class DeepSpeedTrainStrategy(TorchTrainStrategy):
    """`TorchTrainStrategy` whose model and optimizer live in a DeepSpeed engine."""

    FUSED_ADAMW = False  # ZeRO swaps in its flat partitions (and may move them to the CPU)

    def __init__(self, model: nn.Module, *, ds_config: dict[str, Any] | None = None, **kwargs) -> None:
        super().__init__(model, **kwargs)  # AdamW and the LR schedule, as in every strategy
        deepspeed = _import_deepspeed()
        self._deepspeed = deepspeed
        _skip_shm_build(deepspeed)
        self.dp_rank, self.dp_size = ensure_process_group(self.device)  # DeepSpeed averages over them
        deepspeed.init_distributed(dist_backend="nccl" if self.device.type == "cuda" else "gloo")
        config = deepspeed_config(
            ds_config or {}, micro_batch_size=self.micro_batch_size, max_grad_norm=self.max_grad_norm
        )
        self.zero_stage = int(config["zero_optimization"].get("stage", 0))
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=self.model, optimizer=self.optimizer, config=config
        )
        self.model = self.engine.module
        # Training forwards go through the engine: ZeRO-3 counts micro-batches there, and a forward
        # that bypasses it makes the next backward overwrite the accumulated gradient.
        self.train_module = self.engine
        # The LR schedule was built on the bare AdamW, whose param groups the ZeRO wrapper shares.

    def _backward(self, loss: torch.Tensor, last: bool) -> None:
        self.engine.set_gradient_accumulation_boundary(last)
        self.engine.backward(loss)

    def _clip_and_step(self, finite: bool) -> tuple[float, bool]:
        grad_norm = float("nan")
        if self.zero_stage == 0:
            grad_norm = _as_float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm))
            finite = finite and bool(torch.isfinite(torch.tensor(grad_norm)).item())
        if not finite:  # skip: throw the accumulated gradients away, leave weights and moments
            self.engine.optimizer.zero_grad(set_to_none=True)
            self.engine.zero_grad()
            return grad_norm, True
        self.engine.step()
        if self.zero_stage > 0:
            grad_norm = float(self.engine.get_global_grad_norm())
        return grad_norm, False

    def _gathered(self, modifier_rank: int | None = None):
        """Full parameters inside the block under ZeRO-3 (they are partitioned otherwise)."""
        if self.zero_stage < 3:
            return contextlib.nullcontext()
        return self._deepspeed.zero.GatheredParameters(list(self.model.parameters()), modifier_rank=modifier_rank)

    def _full_state(self) -> dict[str, torch.Tensor]:
        with self._gathered():
            return super()._full_state()

    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """New weights in the module and in the optimizer's fp32 master copy, which ZeRO 1-3 keep
        apart from the module (without it the next step would start from the old weights)."""
        with self._gathered(modifier_rank=0):
            self.model.load_state_dict(state_dict)
        if self.zero_stage > 0:
            from deepspeed.utils import safe_set_full_fp32_param

            for name, param in self.model.named_parameters():
                if param.requires_grad:  # frozen (LoRA base) weights have no master copy
                    safe_set_full_fp32_param(param, state_dict[name].to(torch.float32))

    def save_checkpoint(self, directory: str | Path) -> None:
        """An HF model dir (full weights) + DeepSpeed's own files for the optimizer + scheduler.pt."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = self._full_state()
        if self.engine.global_rank == 0:
            self._save_model_dir(directory, state)
            torch.save(self.scheduler.state_dict(), directory / "scheduler.pt")
        self.engine.save_checkpoint(str(directory), tag=CHECKPOINT_TAG, save_latest=False)

    def load_checkpoint(self, directory: str | Path) -> None:
        directory = Path(directory)
        self.engine.load_checkpoint(
            str(directory), tag=CHECKPOINT_TAG, load_optimizer_states=True, load_lr_scheduler_states=False
        )
        restore_schedule(self.scheduler, torch.load(directory / "scheduler.pt", weights_only=True))

    def offload(self, to: str | torch.device = "cpu") -> None:
        """ZeRO 1-3: DeepSpeed's own `offload_states` (to CPU only; it empties the module's
        parameters until `reload`). Stage 0 has no ZeRO optimizer: the `torch` strategy's move.

        ZeRO-3's `offload_states` moves the fp32 master partitions and Adam moments only for
        DeepSpeed's FusedAdam (it asserts so); ours is torch's AdamW, so DeepSpeed moves the module
        partitions, gradients and buckets, and we move the master partitions and moments. With
        `offload_optimizer` configured (ZeRO-Offload) those already live on CPU and stay there.
        """
        if self.zero_stage == 0:
            return super().offload(to)
        if torch.device(to).type != "cpu":
            raise ValueError(f"deepspeed offloads ZeRO states to CPU only (got {to!r})")
        from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum, OffloadStateTypeEnum

        include = None
        if self.zero_stage == 3:
            include = [
                OffloadStateTypeEnum.lp_params,
                OffloadStateTypeEnum.lp_grads,
                OffloadStateTypeEnum.contiguous_grad_buffer,
            ]
            if not self.engine.zero_use_cpu_optimizer():
                move_optimizer_state_(self.engine.optimizer.optimizer, to, with_params=True)
        # pinned host memory makes the way back faster; there is nothing to pin for on CPU
        self.engine.offload_states(include=include, device=OffloadDeviceEnum.cpu, pin_memory=self.device.type == "cuda")

    def reload(self) -> None:
        if self.zero_stage == 0:
            return super().reload()
        if self.zero_stage == 3 and not self.engine.zero_use_cpu_optimizer():
            move_optimizer_state_(self.engine.optimizer.optimizer, self.device, with_params=True)
        self.engine.reload_states()
