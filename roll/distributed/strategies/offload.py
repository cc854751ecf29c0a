"""Moving a role's tensors off its device and back, for roles that share a GPU (colocated roles,
see `roll.distributed.placement`): the training strategies, the reference model and the `hf`
engine use these helpers for their `offload` / `reload`.

Every move copies, even onto the device a tensor already is on. Across devices (the GPU path) a
move is a copy anyway; on one device (the CPU tests) the copy is what lets a test see that each
tensor really moved (new storage, same values) instead of being skipped.
"""

from __future__ import annotations

import torch
from torch import nn


def move_module_(module: nn.Module, device: str | torch.device) -> None:
    """Parameters (with their gradients) and buffers of `module` onto `device`, in place.

    The Parameter objects stay the same, so optimizers keep their references and tied weights
    stay tied. Goes through `nn.Module._apply`, which `module.to()` uses too, so a module that
    overrides it keeps its own bookkeeping right (FSDP2's `FSDPModule` reshards first and resets
    its sharded parameters after). torch swaps in new Parameter objects for a move it cannot do in
    place (to "meta", say); that is refused here, since it would silently detach the optimizer.
    """
    params = list(module.parameters())
    module._apply(lambda tensor: tensor.to(device, copy=True))
    if any(old is not new for old, new in zip(params, module.parameters(), strict=True)):
        raise RuntimeError(
            f"moving the model to {device} replaced its parameters; the optimizer and tied weights would lose them"
        )


def move_optimizer_state_(
    optimizer: torch.optim.Optimizer, device: str | torch.device, *, with_params: bool = False
) -> None:
    """Every tensor of the optimizer's per-parameter state (Adam's moments) onto `device`, in place
    (the same state dicts, keyed by the same parameters); `with_params` moves the parameters the
    optimizer steps too (by `.data`, keeping the objects), for an optimizer whose parameters no
    module owns (ZeRO-3's fp32 master partitions).

    `step` counters stay where torch keeps them: on CPU unless the group is `capturable` or `fused`
    (torch's own rule when it loads a state dict).
    """
    with torch.no_grad():
        for group in optimizer.param_groups:
            step_on_device = bool(group.get("capturable") or group.get("fused"))
            for param in group["params"]:
                if with_params:
                    param.data = param.data.to(device, copy=True)
                state = optimizer.state.get(param, {})
                for key, value in state.items():
                    if torch.is_tensor(value) and (key != "step" or step_on_device):
                        state[key] = value.to(device, copy=True)


def release_cached_memory(device: str | torch.device) -> None:
    """Hand the CUDA caching allocator's free blocks back to the driver, so that a colocated
    process (another role on the same GPU) can use them; nothing to do on CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
