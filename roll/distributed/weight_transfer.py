"""How the actor's weights reach the inference engines (`model_update`): by CUDA IPC handles when the
trainer and every engine share one GPU, else as CPU copies (the path every layout can take).

`choose_sync_path` decides from plain facts about the run: CUDA IPC (`CUDA_IPC`) only when the
trainer is one process on a GPU holding the whole model (`torch` strategy: no sharding to gather),
without LoRA (the engine needs merged weights, which are new tensors), and every engine is an `hf`
engine on that same GPU of the same node. Anything else takes `CPU_COPY`.

On the IPC path the trainer shares its own parameters, without a copy: `share_state` turns device
tensors into handles (`torch.multiprocessing.reductions.reduce_tensor`, picklable, so they travel
as a Ray object), and the engine's process opens them (`IpcWeights.open`) as tensors on the same
device memory, copies them into its own parameters in place (`HFInferStrategy.load_weights`: the
storage captured CUDA graphs point at stays), then drops them (`IpcWeights.close`: synchronizes
first, so the copy is done before the trainer may change or free its tensors). The trainer must
stay resident, unchanged, until the engine returns: the pipeline syncs in a phase where both are
resident (`roll.pipeline.phases.gpu_offload`, phase "sync_on_device").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import reduce_tensor

CUDA_IPC = "cuda_ipc"
CPU_COPY = "cpu_copy"


def choose_sync_path(
    trainer: tuple[int | None, str | None],
    engines: Sequence[tuple[int | None, str | None]],
    *,
    trainer_ranks: int,
    trainer_strategy: str,
    lora: bool,
    engine_strategy: str,
) -> str:
    """`CUDA_IPC` or `CPU_COPY` (module docstring). `trainer` and each engine: (GPU index as the
    driver sees it, or None on CPU; node id, None: the driver's node); strategy names canonical
    (`roll.distributed.strategies.registry.canonical_name`)."""
    device, node = trainer
    shared = bool(engines) and all(engine == (device, node) for engine in engines)
    if device is None or not shared or trainer_ranks != 1 or lora:
        return CPU_COPY
    if trainer_strategy != "torch_train" or engine_strategy != "hf_infer":
        return CPU_COPY
    return CUDA_IPC


@dataclass
class IpcWeights:
    """A state dict as CUDA IPC handles: name -> (rebuild function, its arguments)."""

    handles: dict[str, tuple[Any, tuple]]

    def open(self) -> dict[str, torch.Tensor]:
        """The tensors, in this process, on the sender's device memory (no copy)."""
        return {name: rebuild(*args) for name, (rebuild, args) in self.handles.items()}

    @staticmethod
    def close(tensors: dict[str, torch.Tensor]) -> None:
        """Wait for the copies out of `tensors` to finish, then let them go."""
        first = next(iter(tensors.values()), None)
        if first is not None and first.is_cuda:
            torch.cuda.synchronize(first.device)
        tensors.clear()


def share_state(state: dict[str, torch.Tensor]) -> IpcWeights:
    """Handles of CUDA tensors (detached views of the sender's own storage). A CPU tensor (a
    device stood in for by the CPU, in tests) travels in the same envelope as itself, pickled: a
    copy, so the receiving side runs the same steps."""
    return IpcWeights({name: _handle(tensor.detach()) for name, tensor in state.items()})


def _handle(tensor: torch.Tensor) -> tuple[Any, tuple]:
    return reduce_tensor(tensor) if tensor.is_cuda else (_as_is, (tensor,))


def _as_is(tensor: torch.Tensor) -> torch.Tensor:
    return tensor
