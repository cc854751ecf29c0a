"""What the `megatron` strategy's model-parallel ranks do together, besides the model's own
collectives: agree on the layout from ROLL's keys, gather the weight shards, and clip by the norm
of the whole gradient (over tensor- and pipeline-parallel ranks). Plain torch.distributed (no megatron import),
so it is unit-tested on CPU
with one process as with several (gloo on CPU, nccl on CUDA: tensors go to the group's device).

Layout: megatron-core's default rank order "tp-cp-ep-dp-pp" puts the tensor-parallel ranks of
one model replica next to each other and the pipeline stages outermost, so with `world_size` =
tp * dp * pp process r is tensor-parallel rank r % tp of data-parallel rank (r // tp) % dp, in
pipeline stage r // (tp * dp) (`roll.distributed.ranks.data_parallel_ranks` says the same to the
driver, which hands every rank of one data-parallel rank, all its stages, the same rows).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn

PARALLEL_KEYS = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "expert_model_parallel_size",
    "context_parallel_size",
    "sequence_parallel",
    "use_distributed_optimizer",
    "recompute_granularity",
)
"""ROLL's `strategy_config` keys of `megatron_train` / `megatron_infer` that this strategy reads."""


def check_parallel_config(
    world_size: int,
    tensor_model_parallel_size: int = 1,
    pipeline_model_parallel_size: int = 1,
    expert_model_parallel_size: int = 1,
    context_parallel_size: int = 1,
    sequence_parallel: bool = False,
    use_distributed_optimizer: bool = False,
    recompute_granularity: str | None = None,
) -> None:
    """A one-line ValueError naming the first key whose value is not built, else None.

    Built: tensor parallel of any size that divides the model (checked when the weights are
    split), pipeline parallel of any size that divides the number of layers (checked when the
    model is built, megatron_train), `use_distributed_optimizer` (accepted: a data-parallel rank here holds the whole
    optimizer state, which gives the same steps; only memory differs), `recompute_granularity`
    "full" or "selective" or null (megatron's activation recomputation, `TransformerConfig`).
    Not built: expert parallel (no MoE model converts), context parallel, sequence parallel."""
    sizes = {
        "tensor_model_parallel_size": tensor_model_parallel_size,
        "pipeline_model_parallel_size": pipeline_model_parallel_size,
        "expert_model_parallel_size": expert_model_parallel_size,
        "context_parallel_size": context_parallel_size,
    }
    for key, size in sizes.items():
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"strategy_config.{key}: must be an integer >= 1 (got {size!r})")
    refusals = {
        "expert_model_parallel_size": (
            expert_model_parallel_size > 1,
            "expert parallel needs a MoE model; only dense Llama/Qwen2 convert",
        ),
        "context_parallel_size": (context_parallel_size > 1, "context parallel is not built"),
        "sequence_parallel": (bool(sequence_parallel), "sequence parallel is not built"),
        "recompute_granularity": (
            recompute_granularity not in (None, "full", "selective"),
            f"{recompute_granularity!r} is not one of full, selective, null",
        ),
    }
    for key, (refused, why) in refusals.items():
        if refused:
            raise ValueError(f"strategy_config.{key}: {why}")
    model_parallel = tensor_model_parallel_size * pipeline_model_parallel_size
    if world_size % model_parallel:
        key = "tensor_model_parallel_size" if tensor_model_parallel_size > 1 else "pipeline_model_parallel_size"
        raise ValueError(
            f"strategy_config.{key}: world_size {world_size} is not divisible "
            f"by tensor_model_parallel_size * pipeline_model_parallel_size = {model_parallel}"
        )


def check_pipeline_stages(
    pipeline_model_parallel_size: int, num_layers: int, first: int | None = None, last: int | None = None
) -> list[int]:
    """The decoder layers of each pipeline stage, as megatron splits them: `first` / `last`
    (`num_layers_in_first_pipeline_stage` / `..._last_...`, None: an equal share) on the first and
    last stage, the rest in equal shares over the stages between. A one-line ValueError naming
    the key when the split cannot be made (every stage holds at least one layer)."""
    pp = pipeline_model_parallel_size
    for key, value in (("num_layers_in_first_pipeline_stage", first), ("num_layers_in_last_pipeline_stage", last)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"strategy_config.{key}: must be an integer >= 1 (got {value!r})")
        if pp < 2:
            raise ValueError(f"strategy_config.{key}: needs pipeline_model_parallel_size >= 2 (got {pp})")
    if first is None and last is None:
        if num_layers % pp:
            raise ValueError(
                f"strategy_config.pipeline_model_parallel_size: {pp} does not divide the model's "
                f"{num_layers} decoder layers (num_hidden_layers); each stage holds num_layers / pp, "
                "or set num_layers_in_first_pipeline_stage / num_layers_in_last_pipeline_stage"
            )
        return [num_layers // pp] * pp
    rest = num_layers - (first or 0) - (last or 0)
    middle = pp - (first is not None) - (last is not None)
    key = "num_layers_in_first_pipeline_stage" if first is not None else "num_layers_in_last_pipeline_stage"
    if rest < middle or (middle == 0 and rest) or (middle and rest % middle):
        raise ValueError(
            f"strategy_config.{key}: the other {middle} stage(s) cannot share the remaining {rest} "
            f"of {num_layers} decoder layers equally (at least one each)"
        )
    share = rest // middle if middle else 0
    return [first or share] + [share] * (pp - 2) + [last or share]


def gather_shards(local: dict[str, torch.Tensor], group: dist.ProcessGroup | None) -> list[dict[str, torch.Tensor]]:
    """Every tensor-parallel rank's `local` state dict (same names and shapes on every rank, as
    megatron's shards are), in rank order; all ranks of `group` must call it. One rank: [local]."""
    size = dist.get_world_size(group)
    if size == 1:
        return [local]
    shards: list[dict[str, torch.Tensor]] = [{} for _ in range(size)]
    for name, tensor in local.items():
        pieces = [torch.empty_like(tensor) for _ in range(size)]
        dist.all_gather(pieces, tensor.detach().contiguous(), group=group)
        for shard, piece in zip(shards, pieces, strict=True):
            shard[name] = piece
    return shards


def clip_grad_norm_tensor_parallel_(
    params: Iterable[tuple[nn.Parameter, bool]],
    max_norm: float,
    group: dist.ProcessGroup | None,
    pipeline_group: dist.ProcessGroup | None = None,
    copies: Iterable[nn.Parameter] = (),
) -> float:
    """Clip the gradients of one tensor-parallel model replica by the L2 norm of the WHOLE
    gradient, as `torch.nn.utils.clip_grad_norm_` does for an unsplit model: squares of sharded
    gradients are summed over the ranks, replicated ones counted once (on rank 0 of `group`).
    Same clip coefficient as torch's, max_norm / (norm + 1e-6) capped at 1. `params`: (parameter,
    whether it is split over the ranks) pairs; megatron marks split ones `tensor_model_parallel`
    only when it initialises them, which a model loaded from converted weights skips, so the
    caller says it (`convert.is_tensor_parallel`). `pipeline_group`: the stages of a
    pipeline, each holding other parameters, whose squares are summed too; `copies`: parameters
    whose gradient another stage counts (the last stage's copy of tied embeddings): scaled, not
    counted. Returns the norm (inf or nan when a gradient is non-finite; nothing is scaled then)."""
    grads = [(p.grad, sharded) for p, sharded in params if p.grad is not None]
    first_rank = dist.get_rank(group) == 0
    device = grads[0][0].device if grads else torch.device("cpu")
    squares = torch.zeros((), dtype=torch.float64, device=device)
    for grad, sharded in grads:
        if sharded or first_rank:
            squares += grad.detach().double().pow(2).sum()
    dist.all_reduce(squares, group=group)
    if pipeline_group is not None and dist.get_world_size(pipeline_group) > 1:
        dist.all_reduce(squares, group=pipeline_group)
    norm = float(squares.sqrt())
    if math.isfinite(norm):
        coef = min(1.0, max_norm / (norm + 1e-6))
        if coef < 1.0:
            for grad in [grad for grad, _ in grads] + [p.grad for p in copies if p.grad is not None]:
                grad.mul_(coef)
    return norm
