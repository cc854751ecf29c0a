"""Reward normalisation before advantage estimation: ROLL's `reward_normalization` block.

The response-level score of every sample is rescaled before the advantage estimator sees it, as
ROLL's `agentic_reward_norm` does, by `reward_normalization {grouping, norm_mean_type,
norm_std_type}`: `grouping` is the non-tensor key whose equal values form a group
(`traj_group_id`, `tag` or `batch`; the caller passes those values as `group_keys`); the mean
subtracted and the std + eps divided by are the batch's ("batch"), the row's group's ("group") or
none (None); stds are unbiased, eps = 1e-6. ROLL's older `method` names pairs of them
(`norm_types_for_method`); "asym_clip" then clamps to [-1, 3], as ROLL's original code did.
`clip_symmetric` is ROLL's `reward_clip` / `advantage_clip`: clamp to [-limit, limit] and report
the fraction that was outside.

Where this differs from ROLL: a group (or batch) without spread, one member or all scores exactly
equal, divides by 1 and keeps its centred value; ROLL zeroes every row of it whatever the mean
type, so under ("batch", "group") a lone trajectory loses its reward. Each mode in full:
docs/algorithms.md#reward-normalisation-in-full.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from roll.algorithms.advantages import group_index
from roll.core.reward_norm import (  # the method table is shared with the config; re-exported here
    ASYM_CLIP_RANGE,
    NORM_TYPES,
    NormMethod,
    NormType,
    norm_types_for_method,
)

__all__ = [
    "ASYM_CLIP_RANGE",
    "NORM_TYPES",
    "NormMethod",
    "NormType",
    "clip_symmetric",
    "norm_types_for_method",
    "normalize_rewards",
]


@torch.no_grad()
def clip_symmetric(values: Tensor, limit: float, mask: Tensor | None = None) -> tuple[Tensor, float]:
    """values clamped to [-limit, limit], and the fraction of them (of the masked ones when `mask`
    is given, same shape) that were outside. Any shape."""
    if limit <= 0:
        raise ValueError(f"limit must be > 0, got {limit}")
    outside = (values.abs() > limit).to(torch.float32)
    fraction = outside.mean() if mask is None else (outside * mask).sum() / mask.sum().clamp_min(1)
    return values.clamp(-limit, limit), float(fraction) if values.numel() else 0.0


class _RowStats(NamedTuple):
    """Statistics of the set of rows (the batch, or one group) each row belongs to, per row (B,)."""

    mean: Tensor
    divisor: Tensor
    has_spread: Tensor


def _row_stats(scores: Tensor, sets: Tensor, eps: float) -> _RowStats:
    """Mean, divisor (std + eps, or 1 without spread) and spread flag of each row's set.

    scores (B,) float; sets (B,) dense codes 0..S-1 (all zeros for the batch). The std is the
    unbiased one; a set without spread (one member, or every score equal) has divisor exactly 1.
    """
    num_sets = int(sets.max()) + 1 if sets.numel() else 0
    counts = torch.bincount(sets, minlength=num_sets).to(scores.dtype)
    means = scores.new_zeros(num_sets).index_add_(0, sets, scores) / counts.clamp_min(1)
    deviations = scores - means[sets]
    sq_sums = scores.new_zeros(num_sets).index_add_(0, sets, deviations * deviations)
    stds = torch.sqrt(sq_sums / (counts - 1).clamp_min(1))
    empty = scores.new_zeros(num_sets)
    highest = empty.scatter_reduce(0, sets, scores, "amax", include_self=False)
    lowest = empty.scatter_reduce(0, sets, scores, "amin", include_self=False)
    has_spread = highest > lowest
    divisors = torch.where(has_spread, stds + eps, torch.ones_like(stds))
    return _RowStats(means[sets], divisors[sets], has_spread[sets])


@torch.no_grad()
def normalize_rewards(
    scores: Tensor,
    group_keys: Sequence[Hashable] | Tensor,
    *,
    norm_mean_type: NormType,
    norm_std_type: NormType,
    eps: float = 1e-6,
    clip_range: tuple[float, float] | None = None,
) -> Tensor:
    """Normalised scores (B,): (s - mean) / (std + eps), each part chosen as in ROLL.

    scores (B,): one score per sample; integer scores become the default float dtype.
    group_keys (B,): hashables or a tensor; equal keys form a group, in any row order.
    norm_mean_type, norm_std_type: "batch", "group" or None (see the module docstring).
    A divisor over rows without spread is 1, and centring over such rows gives exactly 0.
    clip_range (low, high): clamp the result ("asym_clip" passes ASYM_CLIP_RANGE); None: no clamp.
    """
    for name, value in (("norm_mean_type", norm_mean_type), ("norm_std_type", norm_std_type)):
        if value not in NORM_TYPES:
            raise ValueError(f"{name} must be one of {NORM_TYPES}, got {value!r}")
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D (one per sample), got shape {tuple(scores.shape)}")
    if not scores.is_floating_point():
        scores = scores.to(torch.get_default_dtype())
    groups = group_index(group_keys, scores.shape[0]).to(scores.device)
    sets = {"batch": torch.zeros_like(groups), "group": groups}
    kinds = {kind for kind in (norm_mean_type, norm_std_type) if kind is not None}
    stats = {kind: _row_stats(scores, sets[kind], eps) for kind in kinds}
    normalized = scores
    if norm_mean_type is not None:
        centre = stats[norm_mean_type]
        normalized = torch.where(centre.has_spread, scores - centre.mean, torch.zeros_like(scores))
    if norm_std_type is not None:
        normalized = normalized / stats[norm_std_type].divisor
    if clip_range is not None:
        normalized = normalized.clamp(*clip_range)
    return normalized
