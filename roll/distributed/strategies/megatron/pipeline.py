"""Pipeline parallel for the `megatron` strategy as autograd across ranks (plain torch.distributed,
no megatron import): gloo on CPU, nccl on CUDA alike.

Contract: every stage of one pipeline is called with the same rows (one data-parallel rank); a
forward sends each stage's output hidden state (S, B, H) to the next, and the last stage
broadcasts the logits to every stage, so each rank's role code computes the same loss;
`loss.backward()` on every rank carries the gradients back stage by stage, last to first, and
nothing waits in a cycle. The schedule is naive, correct and not fast: one micro-batch at a time
through all stages (no 1F1B, no overlap).

Why not megatron-core's schedules, and each step of a forward and backward:
docs/engines/megatron.md, "Internals".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class PipelineLinks:
    """This rank's place in its pipeline: `stage` of `size`, and the global ranks of every stage
    (`ranks[s]`), in `group` (megatron's pipeline-parallel group: same tensor- and data-parallel rank)."""

    group: dist.ProcessGroup
    stage: int
    ranks: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.size - 1


def pipeline_links(group: dist.ProcessGroup) -> PipelineLinks:
    ranks = tuple(dist.get_global_rank(group, i) for i in range(dist.get_world_size(group)))
    return PipelineLinks(group, dist.get_rank(group), ranks)


class _ReceiveActivation(torch.autograd.Function):
    """Forward: the previous stage's output hidden state. Backward: its gradient goes back there.
    `anchor` is an empty tensor that requires grad, so autograd records this node at all."""

    @staticmethod
    def forward(
        ctx, anchor: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, links: PipelineLinks
    ) -> torch.Tensor:
        ctx.links = links
        hidden = torch.empty(shape, dtype=dtype, device=anchor.device)
        dist.recv(hidden, src=links.ranks[links.stage - 1], group=links.group)
        return hidden

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        links = ctx.links
        dist.send(grad.contiguous(), dst=links.ranks[links.stage - 1], group=links.group)
        return None, None, None, None


class _LogitsFromLastStage(torch.autograd.Function):
    """Forward: send this stage's output `hidden` on to the next stage and receive the logits the
    last stage broadcasts. Backward: the gradient of `hidden`, received from the next stage; the
    logits' own gradient is dropped (the last stage back-propagates the same loss itself)."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, logits_shape: tuple[int, ...], links: PipelineLinks) -> torch.Tensor:
        ctx.links, ctx.shape, ctx.dtype = links, hidden.shape, hidden.dtype
        dist.send(hidden.detach().contiguous(), dst=links.ranks[links.stage + 1], group=links.group)
        logits = torch.empty(logits_shape, dtype=hidden.dtype, device=hidden.device)
        dist.broadcast(logits, src=links.ranks[-1], group=links.group)
        return logits

    @staticmethod
    def backward(ctx, grad_logits: torch.Tensor):
        links = ctx.links
        grad = torch.empty(ctx.shape, dtype=ctx.dtype, device=grad_logits.device)
        dist.recv(grad, src=links.ranks[links.stage + 1], group=links.group)
        return grad, None, None


def receive_activation(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, links: PipelineLinks
) -> torch.Tensor:
    """The previous stage's output (stage > 0), in the autograd graph when grad is enabled."""
    anchor = torch.empty(0, device=device, requires_grad=torch.is_grad_enabled())
    return _ReceiveActivation.apply(anchor, shape, dtype, links)


def logits_from_last_stage(hidden: torch.Tensor, logits_shape: tuple[int, ...], links: PipelineLinks) -> torch.Tensor:
    """On a stage before the last: send `hidden` on, return the whole model's logits (class docstring)."""
    return _LogitsFromLastStage.apply(hidden, logits_shape, links)


def broadcast_logits(logits: torch.Tensor, links: PipelineLinks) -> None:
    """On the last stage: send `logits` to every other stage. Its autograd is the identity (the
    rank keeps using `logits` itself), so the loss gradient is counted once, here."""
    dist.broadcast(logits.detach().contiguous(), src=links.ranks[-1], group=links.group)


def gather_stages(
    local: dict[str, torch.Tensor], links: PipelineLinks, device: torch.device
) -> dict[str, torch.Tensor]:
    """Every stage's `local` tensors (whole-model names, disjoint between stages) on every stage, in
    stage order; all stages must call it. Names, shapes and dtypes go first (a small object
    all-gather), then each tensor is broadcast from its stage."""
    if links.size == 1:
        return dict(local)
    layouts: list[Any] = [None] * links.size  # all_gather_object fills every slot with a stage's list
    dist.all_gather_object(layouts, [(name, tuple(t.shape), t.dtype) for name, t in local.items()], group=links.group)
    gathered = {}
    for stage, layout in enumerate(layouts):
        for name, shape, dtype in layout:
            if stage == links.stage:
                tensor = local[name].detach().contiguous()
            else:
                tensor = torch.empty(shape, dtype=dtype, device=device)
            dist.broadcast(tensor, src=links.ranks[stage], group=links.group)
            gathered[name] = tensor
    return gathered
