"""How the data-parallel ranks of one role share a batch: pure functions, no Ray, no process group.

Forward passes (`compute_logprobs`, `compute_values`): the batch's rows are cut into `world_size`
contiguous, near-equal slices (`split_rows`), rank r computes slice r, and the outputs are
concatenated in rank order (`merge_rows`), which is the batch's row order.

Training: every rank sees the whole batch and draws the same mini-batch order (same seed), so the
ranks agree on each mini-batch without talking; rank r trains on slice r of each mini-batch
(`rank_share`). For the ranks together to take exactly the step of one process on the whole
mini-batch, a micro-batch's weight is its count (response tokens for token-mean losses, rows with
a response token for sequence-mean ones) over the count of the WHOLE mini-batch, not of the rank's
share (`micro_weights`): rank shares hold different numbers of tokens, and weighting each by its
own count would give the mean of the ranks' means. DeepSpeed, FSDP2 and megatron average gradients
over ranks (sum / world_size), so the weights are multiplied by `world_size` to make that average
the sum of the ranks' terms.
"""

from __future__ import annotations

from typing import Literal

import torch
from tensordict import TensorDict

from roll.distributed.dynamic_batching import row_lengths
from roll.distributed.sequence_packing import balanced_rank_rows

WeightBy = Literal["tokens", "rows"]


def split_rows(num_rows: int, world_size: int) -> list[slice]:
    """`world_size` contiguous slices covering rows 0..num_rows-1 in order; the first
    `num_rows % world_size` slices hold one row more. A slice is empty when rows run out."""
    base, extra = divmod(num_rows, world_size)
    bounds = [0]
    for rank in range(world_size):
        bounds.append(bounds[-1] + base + (rank < extra))
    return [slice(start, stop) for start, stop in zip(bounds[:-1], bounds[1:], strict=True)]


def data_parallel_ranks(world_size: int, tensor_parallel: int = 1, pipeline_parallel: int = 1) -> list[int]:
    """The data-parallel rank of each of a role's `world_size` processes, in process order, under
    megatron-core's rank order "tp-cp-ep-dp-pp" (tensor-parallel ranks adjacent): process r is
    data-parallel rank (r // tp) % (world_size // (tp * pp)). All processes of one data-parallel
    rank must see the same rows. Without model parallelism, process r is data-parallel rank r."""
    data_parallel = world_size // (tensor_parallel * pipeline_parallel)
    return [(rank // tensor_parallel) % data_parallel for rank in range(world_size)]


def merge_rows(parts: list[torch.Tensor], row_counts: list[int]) -> torch.Tensor:
    """The ranks' outputs, (rows_r, T) each, as one (B, T) in rank order; each part keeps only its
    first `row_counts[r]` rows (a rank without rows computed a stand-in row, `rank_input`)."""
    return torch.cat([part[:count] for part, count in zip(parts, row_counts, strict=True)])


def rank_input(batch: TensorDict, rows: slice) -> TensorDict:
    """Rank's rows of `batch`; a rank left without rows gets the first row as a stand-in (its
    engine may still have to join the others' collectives), whose output `merge_rows` drops."""
    return batch[rows] if rows.stop > rows.start else batch[:1]


def weight_counts(response_mask: torch.Tensor, weight_by: WeightBy) -> torch.Tensor:
    """What a loss averages over, per row (B,): response tokens ("tokens", token-mean), or 1 for a
    row with any response token ("rows", the sequence-mean modes, which leave empty rows out)."""
    if weight_by == "tokens":
        return response_mask.sum(dim=-1).float()
    return (response_mask.sum(dim=-1) > 0).float()


def rank_share(
    minibatch: TensorDict, rank: int, world_size: int, weight_by: WeightBy, balanced: bool = False
) -> tuple[TensorDict, float]:
    """Rank `rank`'s rows of `minibatch` and the mini-batch's total count (`weight_counts`) over
    all ranks. A rank left without rows gets the first row with its response mask zeroed: it
    weighs 0 in every loss and metric, and lets the rank join the engine's collectives.
    `balanced` (sequence packing's load_balance): rows spread by workload
    (`roll.distributed.sequence_packing.balanced_rank_rows`) instead of in consecutive slices."""
    total = float(weight_counts(minibatch["response_mask"], weight_by).sum())
    if balanced:
        mine = balanced_rank_rows(row_lengths(minibatch["attention_mask"]), world_size)[rank]
        rows = torch.tensor(mine, dtype=torch.long)
        return (minibatch[rows], total) if mine else (without_responses(minibatch[:1]), total)
    span = split_rows(minibatch.batch_size[0], world_size)[rank]
    if span.stop > span.start:
        return minibatch[span], total
    return without_responses(minibatch[:1]), total


def without_responses(micro: TensorDict) -> TensorDict:
    """A copy of `micro` with no response token: its loss and its weight are 0."""
    copy = micro.clone()
    copy["response_mask"] = torch.zeros_like(copy["response_mask"])
    return copy


def micro_weights(
    micros: list[TensorDict], weight_by: WeightBy, total: float | None = None, world_size: int = 1
) -> list[float]:
    """Each micro-batch's weight in the mini-batch loss: its count over `total` times `world_size`
    (module docstring). `total` None: the micro-batches' own sum, one process's whole mini-batch.
    Nothing counted at all: uniform weights (the loss is 0 then; see `agg_loss`)."""
    counts = [float(weight_counts(m["response_mask"], weight_by).sum()) for m in micros]
    total = sum(counts) if total is None else total
    if total == 0:
        return [1.0 / len(micros)] * len(micros)
    return [c / total * world_size for c in counts]
