"""`fsdp2` training strategy: the `torch` strategy with the model sharded by PyTorch's FSDP2
(`torch.distributed.fsdp.fully_shard`). Runs on CPU (gloo) and on GPUs (nccl).

Each decoder layer (the classes an HF model lists in `_no_split_modules`) is its own FSDP unit,
then the root; AdamW steps the sharded DTensors directly. `strategy_config` takes ROLL's
`reshard_after_forward`, `fsdp_size` (HSDP when between 1 and the role's ranks), `param_dtype` /
`reduce_dtype` and `offload_policy`.

Contract: weights leave as full, unsharded CPU tensors (`get_model_state_dict` with
`full_state_dict`), so inference workers and HF checkpoints never see a shard.

What each option means: docs/engines/fsdp2.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from roll.configs.args import ROLL_DTYPES
from roll.distributed.strategies.process_group import ensure_process_group
from roll.distributed.strategies.torch_train import TorchTrainStrategy, restore_schedule
from roll.models.loading import torch_dtype

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def _dtype(name: str | None) -> torch.dtype | None:
    """ROLL's short names (bf16, fp16, fp32) or the long ones; None: the model's dtype."""
    return torch_dtype(ROLL_DTYPES.get(name, name)) if name else None


def mesh_shape(world_size: int, fsdp_size: int | None) -> tuple[int, ...]:
    """(world_size,) for plain FSDP, (replicas, fsdp_size) for HSDP (module docstring)."""
    if fsdp_size is None or fsdp_size <= 1 or fsdp_size >= world_size:
        return (world_size,)
    if world_size % fsdp_size:
        raise ValueError(f"fsdp_size {fsdp_size} does not divide the {world_size} ranks")
    return (world_size // fsdp_size, fsdp_size)


def shard_model(
    model: nn.Module,
    device: torch.device,
    reshard_after_forward: bool = True,
    *,
    fsdp_size: int | None = None,
    param_dtype: str | None = None,
    reduce_dtype: str | None = None,
    offload_policy: bool = False,
) -> int:
    """`fully_shard` every decoder layer, then the root; returns the number of layer units."""
    _, world_size = ensure_process_group(device)
    shape = mesh_shape(world_size, fsdp_size)
    names = ("replicate", "shard") if len(shape) == 2 else None
    mesh = init_device_mesh(device.type, shape, mesh_dim_names=names)
    mp_policy = MixedPrecisionPolicy(param_dtype=_dtype(param_dtype), reduce_dtype=_dtype(reduce_dtype))
    offload = CPUOffloadPolicy() if offload_policy and device.type != "cpu" else OffloadPolicy()
    layer_classes = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in layer_classes]
    for module in [*layers, model]:  # the layers, then the root
        fully_shard(
            module, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp_policy, offload_policy=offload
        )
    return len(layers)


class FSDP2TrainStrategy(TorchTrainStrategy):
    """`TorchTrainStrategy` over an FSDP2-sharded model (see module docstring)."""

    FUSED_ADAMW = False  # measured on an H100: not faster on the sharded parameters (docs/benchmarks.md)

    def __init__(
        self,
        model: nn.Module,
        *,
        reshard_after_forward: bool = True,
        fsdp_size: int | None = None,
        param_dtype: str | None = None,
        reduce_dtype: str | None = None,
        offload_policy: bool = False,
        device="cpu",
        **kwargs,
    ) -> None:
        device = torch.device(device)
        self.model_class = type(model)  # fully_shard swaps in a subclass; load checkpoints with this
        self.num_fsdp_units = shard_model(
            model.to(device),
            device,
            reshard_after_forward,
            fsdp_size=fsdp_size,
            param_dtype=param_dtype,
            reduce_dtype=reduce_dtype,
            offload_policy=offload_policy,
        )
        # the optimizer is built after sharding, on the DTensor parameters
        super().__init__(model, device=device, **kwargs)
        self.rank = torch.distributed.get_rank()
        # FSDP2 reduce-scatters gradients as the mean over ranks
        self.dp_rank, self.dp_size = self.rank, torch.distributed.get_world_size()

    def _full_state(self) -> dict[str, torch.Tensor]:
        # a full state dict holds plain tensors: every DTensor gathered (ValueType also allows DTensors, lists...)
        return cast(dict[str, torch.Tensor], get_model_state_dict(self.model, options=_FULL))

    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        # a dict of plain tensors is one of its ValueType dicts (dict is invariant, so mypy needs the cast)
        set_model_state_dict(
            self.model, cast(dict[str, Any], state_dict), options=StateDictOptions(full_state_dict=True)
        )

    def save_checkpoint(self, directory: str | Path) -> None:
        """An HF model dir of the full weights + the full optimizer state + scheduler.pt (rank 0)."""
        directory = Path(directory)
        model_state = self._full_state()
        optim_state = get_optimizer_state_dict(self.model, self.optimizer, options=_FULL)
        if self.rank == 0:
            directory.mkdir(parents=True, exist_ok=True)
            self._save_model_dir(directory, model_state)
            torch.save(optim_state, directory / "optimizer.pt")
            torch.save(self.scheduler.state_dict(), directory / "scheduler.pt")

    def load_checkpoint(self, directory: str | Path) -> None:
        directory = Path(directory)
        self.load_state_dict(self._saved_model_state(directory))
        optim_state = torch.load(directory / "optimizer.pt", weights_only=True)
        set_optimizer_state_dict(
            self.model, self.optimizer, optim_state, options=StateDictOptions(full_state_dict=True)
        )
        restore_schedule(self.scheduler, torch.load(directory / "scheduler.pt", weights_only=True))
