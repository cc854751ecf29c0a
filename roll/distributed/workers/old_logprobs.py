"""PPO's old log-probs taken inside the actor's training call, not in a pass of their own.

The old log-probs are the trainer's log-probs of the response tokens under the weights before
the update. Within one training call those weights hold until the first optimizer step, so
(`OldLogprobs`):
- the rows of the first mini-batch take them from that step's own forward, detached (its loss
  then sees a ratio of exactly 1, the on-policy value);
- the other rows take them from one no-grad pass just before that step
  (`TrainStrategy.forward_logprobs`, the pass the score phase would have run, on fewer rows).
A batch trained as one mini-batch needs no extra pass at all. The numbers are those of the score
phase's pass up to float rounding (micro-batches of other sizes and widths). ROLL caches the
first step's log-probs the same way (`enable_old_logprobs_recompute: false`), but only when a
step is one mini-batch; with more it runs the whole pass.

Data parallel: every rank gets the whole batch and the same mini-batch order. Each takes its share
of the first mini-batch from its forward and scores its slice of the other rows
(`roll.distributed.ranks.split_rows`); the (B, T) tensor, 0 where a rank has nothing, is then
summed over the ranks (`sum_over_ranks`), so every rank holds every row's values for the later
mini-batches. The rows are disjoint, so the sum adds only zeros.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from roll.algorithms.utils import masked_mean
from roll.core.fields import Batch
from roll.distributed.ranks import rank_input, split_rows
from roll.distributed.strategies.base import TrainStrategy
from roll.distributed.workers.common import scoring_inputs

ROW_INDEX = "old_logprobs_row"
"""(B,) int64: each row's index in the training call's batch, so a micro-batch's loss can put its
log-probs back where they belong."""


class OldLogprobs:
    """The old log-probs (B, T) of one training call's `batch`, of which `first` (row indices)
    is the first mini-batch. `score_others()` before the first optimizer step, `take` in its loss,
    then `tensor()` after it."""

    def __init__(self, batch: TensorDict, first: torch.Tensor, strategy: TrainStrategy, temperature: float):
        self.batch, self.first, self.strategy, self.temperature = batch, first, strategy, temperature
        self.shape = tuple(batch[Batch.RESPONSE_MASK].shape)
        self.captured: torch.Tensor | None = None  # on the device of the training forward
        self.others: tuple[torch.Tensor, torch.Tensor] | None = None  # (rows, log-probs) of this rank's slice

    def first_minibatch(self) -> TensorDict:
        """The first mini-batch, each row carrying its index (`ROW_INDEX`)."""
        minibatch = self.batch[self.first]
        minibatch[ROW_INDEX] = self.first.clone()
        return minibatch

    def score_others(self) -> None:
        """One no-grad pass over this rank's slice of the rows outside the first mini-batch. With
        several ranks every rank runs it, a stand-in row where its slice is empty, since a sharded
        engine's forward is a collective."""
        outside = torch.ones(self.shape[0], dtype=torch.bool)
        outside[self.first] = False
        others = outside.nonzero()[:, 0]
        if len(others) == 0:
            return
        mine = split_rows(len(others), self.strategy.dp_size)[self.strategy.dp_rank]
        rows = others[mine]
        scored = rank_input(scoring_inputs(self.batch)[others], mine)  # only the keys a pass reads are copied
        logprobs, _ = self.strategy.forward_logprobs(scored, self.temperature)
        if len(rows):
            self.others = rows, logprobs

    def take(self, micro: TensorDict, logprobs: torch.Tensor) -> torch.Tensor:
        """The old log-probs of a micro-batch of the first mini-batch: its own `logprobs`, detached,
        noted at its rows' response tokens (a stand-in row with no response token notes nothing)."""
        old = logprobs.detach()
        if self.captured is None:
            self.captured = torch.zeros(self.shape, dtype=old.dtype, device=old.device)
        width = min(old.shape[1], self.shape[1])  # dynamic batching may pad a micro-batch past T
        rows = micro[ROW_INDEX].to(old.device)
        scored = micro[Batch.RESPONSE_MASK][:, :width].to(old.device) > 0
        self.captured[rows, :width] = torch.where(scored, old[:, :width], self.captured[rows, :width])
        return old

    def tensor(self) -> torch.Tensor:
        """(B, T) float32 on CPU: every row's old log-probs, 0.0 outside the response."""
        full = self.captured if self.captured is not None else torch.zeros(self.shape)
        if self.others is not None:
            rows, logprobs = self.others
            full[rows.to(full.device)] = logprobs.to(full.device, full.dtype)
        if self.strategy.dp_size > 1:
            full = self.strategy.sum_over_ranks(full)
        return full.float().cpu()


def logprob_abs_diff(batch: TensorDict) -> dict[str, float]:
    """`rollout/logprob_abs_diff`: the mean |engine - trainer| log-prob gap over response tokens,
    logged by whichever computed the old log-probs (the score phase or the training call)."""
    diff = (batch[Batch.INFER_LOGPROBS] - batch[Batch.OLD_LOGPROBS]).abs()
    return {"rollout/logprob_abs_diff": float(masked_mean(diff, batch[Batch.RESPONSE_MASK]))}
