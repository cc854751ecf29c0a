"""Pieces shared by the training-side roles: thread setup, mini-batch order, rank shares, metric
averaging, the process's GPU memory."""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch
from tensordict import TensorDict

from roll.core.fields import Batch
from roll.core.seeding import derive_seed
from roll.distributed.ranks import WeightBy, rank_share
from roll.distributed.strategies.base import TrainStrategy

GPU_HOST_THREADS = 4
"""torch threads of a process that computes on a GPU, unless its `num_threads` says otherwise."""


def set_num_threads(num_threads: int | None, device: str = "cpu") -> None:
    """Set torch's intra-op threads: `num_threads`, or by default every core of the machine for a
    process that computes on the CPU, and at most `GPU_HOST_THREADS` for one on a GPU.

    Several roles share one machine in a CPU run, so the pipeline passes each its share. A role on
    a GPU uses its CPU threads only for host-side preparation (padding, row hashes, indexing of
    batches of some 10^5 elements), where torch goes parallel above 32,768 elements; with each
    GPU role sizing its pool to the whole machine the pools oversubscribe the cores, and those
    small ops slow down several times over (docs/gpu.md). A role that does heavy CPU work of its
    own (an optimizer offloaded to the CPU) should set `num_threads`.
    """
    if num_threads is None:
        cores = os.cpu_count() or 1
        num_threads = cores if torch.device(device).type == "cpu" else min(GPU_HOST_THREADS, cores)
    torch.set_num_threads(num_threads)


def model_inputs(batch: TensorDict, *keys: str) -> TensorDict:
    """`batch.select(*keys)` plus the rows' images where the batch has them (`Batch.IMAGE_KEYS`):
    a vision-language model scores a row only with the images it was generated from."""
    return batch.select(*keys, *(k for k in Batch.IMAGE_KEYS if k in batch.keys()))


def scoring_inputs(batch: TensorDict) -> TensorDict:
    """What a log-prob pass reads of `batch` (`model_inputs`): ids, attention mask, and the
    response mask where the batch has one, since only response tokens are scored
    (`roll.distributed.micro_batches.token_logprobs`); without one every real token is."""
    scored = (Batch.RESPONSE_MASK,) if Batch.RESPONSE_MASK in batch.keys() else ()
    return model_inputs(batch, Batch.INPUT_IDS, Batch.ATTENTION_MASK, *scored)


def take_memory_gib() -> dict[str, float]:
    """GPU memory of this process's one visible device, GiB: `peak` (the most its tensors held,
    `max_memory_allocated`) and `reserved_peak` (the most torch's caching allocator held) since the
    last call, which restarts both; `total` (the device's size). Zeros where CUDA was never used."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return {"peak": 0.0, "reserved_peak": 0.0, "total": 0.0}
    reading = {
        "peak": torch.cuda.max_memory_allocated() / 2**30,
        "reserved_peak": torch.cuda.max_memory_reserved() / 2**30,
        "total": torch.cuda.mem_get_info()[1] / 2**30,
    }
    torch.cuda.reset_peak_memory_stats()
    return reading


def minibatch_rows(num_rows: int, rows: int, *seed_keys: object) -> Iterator[torch.Tensor]:
    """Row indices of each mini-batch: 0..num_rows-1 in a derived random order, `rows` at a time
    (the last may be fewer). The order depends only on `derive_seed(*seed_keys)`, so a resumed run
    replays it exactly."""
    generator = torch.Generator().manual_seed(derive_seed(*seed_keys))
    order = torch.randperm(num_rows, generator=generator)
    for start in range(0, num_rows, rows):
        yield order[start : start + rows]


def shuffled_minibatches(batch: TensorDict, rows: int, *seed_keys: object) -> Iterator[TensorDict]:
    """The mini-batches of `batch` whose rows `minibatch_rows` draws."""
    for members in minibatch_rows(batch.batch_size[0], rows, *seed_keys):
        yield batch[members]


def average_metrics(
    per_step: list[dict[str, float]], summed: tuple[str, ...] = (), last: tuple[str, ...] = ()
) -> dict[str, float]:
    """Mean of each metric over optimizer steps; keys in `summed` are totals instead (counts),
    keys in `last` the value after the last step (streaks)."""
    out = {key: sum(m[key] for m in per_step) / (1 if key in summed else len(per_step)) for key in per_step[0]}
    return out | {key: per_step[-1][key] for key in last if key in per_step[-1]}


def train_on_share(strategy: TrainStrategy, minibatch: TensorDict, loss_fn, weight_by: WeightBy) -> dict[str, float]:
    """One optimizer step on `minibatch` (a `TrainStrategy`'s `train_step`): the whole of it
    with one rank; with several, this rank's share weighted against the whole mini-batch
    (`roll.distributed.ranks`), so that the ranks together take the one-process step."""
    if strategy.dp_size == 1:
        return strategy.train_step(minibatch, loss_fn, weight_by)
    share, total = rank_share(minibatch, strategy.dp_rank, strategy.dp_size, weight_by, strategy.balance_ranks)
    return strategy.train_step(share, loss_fn, weight_by, total)
