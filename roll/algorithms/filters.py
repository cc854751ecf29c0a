"""StarPO-S uncertainty filtering: train only on the groups whose rewards disagree most.

RAGEN (Wang et al. 2025, "RAGEN: Understanding Self-Evolution in LLM Agents via Multi-Turn
Reinforcement Learning"), StarPO-S: the rollouts of one group start from the same env state, and
the std of their rewards measures how uncertain the policy still is there. A group whose rollouts
all score alike gives GRPO no signal and, the paper finds, feeds the "echo trap" collapse; keeping
only the most uncertain fraction of groups stabilises training. `select_groups_by_reward_std`
returns the rows of the kept groups; `group_reward_std_stats` logs how much signal a batch holds.

Where this differs from RAGEN's `filter_rollout` (rollout_filter_type "std"):
- It keeps ceil(keep_ratio * G) groups, not int(keep_ratio * G): any ratio > 0 keeps at least one
  group, where RAGEN's int(0.25 * 3) = 0 would keep none. The product is taken 1e-9 down first,
  so that float rounding (0.28 * 25 = 7.000000000000001) does not keep an extra group.
- Ties in std are broken by the group's first appearance in the batch; RAGEN's torch.topk leaves
  their order unspecified. The same batch therefore always keeps the same rows.
- Groups are found from their ids, of any size and in any row order; RAGEN reshapes the batch to
  (num_groups, group_size) and needs equal, contiguous groups.
- A group of one member, or whose scores are all exactly equal, has std exactly 0. torch.std of
  0.1, 0.1, 0.1 is 1.7e-17 in float64 (the mean rounds), which would rank that group above a
  singleton and count it as having variance.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

from torch import Tensor

# Subtracted from keep_ratio * num_groups before ceil, to undo float rounding upwards.
_ROUNDING = 1e-9


def _rows_by_group(group_ids: Sequence[Hashable] | Tensor, batch_size: int) -> list[list[int]]:
    """The row indices of each group, groups in order of first appearance, rows ascending."""
    ids = group_ids.tolist() if isinstance(group_ids, Tensor) else list(group_ids)
    if len(ids) != batch_size:
        raise ValueError(f"got {len(ids)} group_ids for {batch_size} scores")
    rows: dict[Hashable, list[int]] = {}
    for row, group_id in enumerate(ids):
        rows.setdefault(group_id, []).append(row)
    return list(rows.values())


def _reward_std(member_scores: Tensor) -> float:
    """Unbiased std of one group's scores; exactly 0 for one member or equal scores."""
    if member_scores.numel() < 2 or bool(member_scores.max() == member_scores.min()):
        return 0.0
    return float(member_scores.double().std())


def _group_stds(scores: Tensor, group_ids: Sequence[Hashable] | Tensor) -> tuple[list[list[int]], list[float]]:
    """(rows of each group, std of each group), groups in order of first appearance."""
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D (one per sample), got shape {tuple(scores.shape)}")
    groups = _rows_by_group(group_ids, scores.shape[0])
    return groups, [_reward_std(scores[rows]) for rows in groups]


def select_groups_by_reward_std(
    scores: Tensor, group_ids: Sequence[Hashable] | Tensor, *, keep_ratio: float
) -> list[int]:
    """Row indices to keep, ascending: every row of the ceil(keep_ratio * G) groups of largest std.

    scores (B,): one score per sample (the episode reward). group_ids (B,): hashables or a
    tensor; equal ids form a group. 0 < keep_ratio <= 1; 1.0 keeps every row. Groups of equal
    std rank by first appearance in the batch.
    """
    if not 0 < keep_ratio <= 1:
        raise ValueError(f"keep_ratio must be in (0, 1], got {keep_ratio}")
    groups, stds = _group_stds(scores, group_ids)
    num_keep = math.ceil(keep_ratio * len(groups) - _ROUNDING)
    # sorted is stable, so groups of equal std keep their order of first appearance.
    ranked = sorted(range(len(groups)), key=lambda group: -stds[group])
    return sorted(row for group in ranked[:num_keep] for row in groups[group])


def group_reward_std_stats(scores: Tensor, group_ids: Sequence[Hashable] | Tensor) -> dict:
    """How much GRPO signal a batch holds, over its G groups.

    scores (B,), group_ids (B,) as in `select_groups_by_reward_std`. Returns
    "rollout/groups_with_variance": the fraction of groups whose std is > 0,
    "rollout/in_group_std": the mean over groups of their std (RAGEN's metric of that name), and
    "rollout/flat_groups_below_best": the fraction of groups whose members all scored alike and
    below the batch's best score (e.g. all failed): group-relative advantages give them nothing.
    An empty batch has no groups to average over and raises ValueError.
    """
    groups, stds = _group_stds(scores, group_ids)
    if not stds:
        raise ValueError("group_reward_std_stats needs at least one sample")
    best = float(scores.max())
    flat_below = sum(std == 0 and float(scores[rows[0]]) < best for rows, std in zip(groups, stds, strict=True))
    return {
        "rollout/groups_with_variance": sum(std > 0 for std in stds) / len(stds),
        "rollout/in_group_std": sum(stds) / len(stds),
        "rollout/flat_groups_below_best": flat_below / len(stds),
    }
