"""`RankGroup`: the data-parallel ranks of one training role, called like one worker handle.

The pipeline calls `group.compute_logprobs.remote(batch, t)` and `ray.get`s one object ref, as it
does with a one-process role; the fan-out lives here, not in the loop:
- `compute_logprobs`, `compute_values`: data-parallel rank d gets slice d of the batch's rows, and
  one small Ray task concatenates the outputs in rank order (`roll.distributed.ranks`). Without
  model parallelism process r is data-parallel rank r; with megatron's tensor parallelism every
  process of one data-parallel rank gets the same slice (`data_ranks`), and the output of the
  first of them is kept (the task still waits for all, so an error on any surfaces).
- `train`, `save_checkpoint`, `load_checkpoint`: every rank gets the same call (the batch is put in
  the object store once); the ref is rank 0's result, ready when every rank has finished, so an
  error on any rank surfaces. Ranks return equal training metrics (`TorchTrainStrategy.train_step`
  sums their terms), and rank 0 writes the checkpoint files.
- `get_weights`: every rank takes part (ZeRO-3 and FSDP2 gather the shards in a collective), and
  the ref is rank 0's copy, so the weights go to the engines straight from rank 0.
Offload and reload are per process (`roll.pipeline.phases.gpu_offload` attaches `handles`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import ray
from tensordict import TensorDict

from roll.distributed.ranks import merge_rows, rank_input, split_rows

SPLIT_BY_ROWS = ("compute_logprobs", "compute_values")
"""Methods whose first argument is a batch that the ranks split by rows."""
ON_EVERY_RANK = ("train", "save_checkpoint", "load_checkpoint", "get_weights", "param_counts")
"""Methods every rank runs with the same arguments (collectives inside the engines); rank 0's
answer is returned (`param_counts`: every rank counts the same unpartitioned model)."""


@ray.remote(num_cpus=0)
def _merge_rows(row_counts: list[int], keep: list[int], *parts):
    return merge_rows([parts[i] for i in keep], row_counts)


@ray.remote(num_cpus=0)
def _rank_zero(*results):
    return results[0]


class _Method:
    """What `handle.method` is for a Ray actor: something with `.remote(...)`."""

    def __init__(self, remote: Callable[..., Any]):
        self.remote = remote


def process_handles(entry: Any) -> list:
    """The actor handle of each process behind one entry of the pipeline's worker dict: a
    `RankGroup`'s ranks (anything with `handles`), a list of replicas, or a single handle."""
    if isinstance(entry, list):
        return entry
    return list(getattr(entry, "handles", [entry]))


class RankGroup:
    """The actor handles of a role's ranks, rank 0 first (see the module docstring)."""

    def __init__(self, handles: Sequence[Any], data_ranks: Sequence[int] | None = None):
        """`data_ranks`: each handle's data-parallel rank (`roll.distributed.ranks.data_parallel_ranks`);
        None: handle r is rank r."""
        if len(handles) < 2:
            raise ValueError("a RankGroup holds two or more ranks; use the one handle itself")
        self.handles = list(handles)
        self.data_ranks = list(range(len(handles)) if data_ranks is None else data_ranks)
        if len(self.data_ranks) != len(self.handles):
            raise ValueError(f"{len(self.data_ranks)} data ranks for {len(self.handles)} handles")

    def __getattr__(self, method: str) -> _Method:
        if method in SPLIT_BY_ROWS:
            return _Method(lambda batch, *args, **kwargs: self._split_by_rows(method, batch, *args, **kwargs))
        if method in ON_EVERY_RANK:
            return _Method(lambda *args, **kwargs: self._on_every_rank(method, *args, **kwargs))
        raise AttributeError(f"RankGroup does not fan out {method!r}; call each of its handles")

    def _split_by_rows(self, method: str, batch: TensorDict, *args, **kwargs):
        slices = split_rows(batch.batch_size[0], max(self.data_ranks) + 1)
        refs = [
            getattr(handle, method).remote(rank_input(batch, slices[rank]), *args, **kwargs)
            for handle, rank in zip(self.handles, self.data_ranks, strict=True)
        ]
        keep = [self.data_ranks.index(rank) for rank in range(len(slices))]  # first process of each
        return _merge_rows.remote([rows.stop - rows.start for rows in slices], keep, *refs)

    def _on_every_rank(self, method: str, *args, **kwargs):
        args = tuple(ray.put(a) if isinstance(a, TensorDict) else a for a in args)  # one copy for all ranks
        refs = [getattr(handle, method).remote(*args, **kwargs) for handle in self.handles]
        return refs[0] if method == "get_weights" else _rank_zero.remote(*refs)
