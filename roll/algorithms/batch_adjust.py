"""ROLL's `batch_adjust_mode`: copy or delete rows so a training batch splits into whole mini-batches.

ROLL (`AgenticPipeline.adjust_batch`, after verl-agent) needs the number of rows to be a multiple of
`divisor`, the least common multiple of every role's rows per optimizer step
(per_device_train_batch_size x gradient_accumulation_steps x data-parallel ranks) and rows per
forward-only call (infer_batch_size x ranks). With r = rows % divisor != 0 the modes are:
- "copy": add divisor - r rows drawn from the batch (without replacement when there are enough);
- "delete": drop r rows drawn at random (falls back to "copy" when that would empty the batch);
- "auto": "copy" when r >= half the batch or the batch is smaller than `divisor`, else "delete";
- "random_sample": keep exactly `divisor` rows drawn at random (ROLL's code keeps one divisor's
  worth, not the largest multiple); "copy" when the batch is smaller than `divisor`.
A copied row counts again in every loss it enters; a deleted one is not trained on.

Where we differ from ROLL: the draws come from the generator the caller passes (the pipeline
derives it from `seed` and the step), not from numpy's global state, so a run repeats; and the
pipeline adjusts the scored batch (after advantages), so copies carry their originals' advantages
and the group statistics are those of the rollout (ROLL adjusts before its advantages, so its
copies also shift a group's mean and deleted rows leave it).
"""

from __future__ import annotations

import math

import numpy as np

MODES = ("copy", "delete", "auto", "random_sample")


def adjusted_rows(batch_size: int, divisor: int, mode: str, rng: np.random.Generator) -> np.ndarray:
    """Row indices of the adjusted batch (see module docstring): the kept rows in their order,
    then the copies. A batch already a multiple of `divisor` is returned whole."""
    if mode not in MODES:
        raise ValueError(f"batch_adjust_mode {mode!r} is not one of {', '.join(MODES)}")
    remainder = batch_size % divisor
    if remainder == 0:
        return np.arange(batch_size)
    if mode == "auto":
        mode = "copy" if remainder >= 0.5 * batch_size or batch_size < divisor else "delete"
    if batch_size < divisor and mode in ("delete", "random_sample"):  # would leave no rows
        mode = "copy"
    if mode == "delete":
        removed = rng.choice(batch_size, remainder, replace=False)
        return np.setdiff1d(np.arange(batch_size), removed)
    if mode == "random_sample":
        return np.sort(rng.choice(batch_size, divisor, replace=False))
    to_add = divisor - remainder
    return np.concatenate([np.arange(batch_size), rng.choice(batch_size, to_add, replace=to_add > batch_size)])


def rows_divisor(per_step_rows: list[int]) -> int:
    """The least common multiple of the roles' rows per call (each >= 1)."""
    return math.lcm(*per_step_rows) if per_step_rows else 1
