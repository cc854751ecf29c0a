"""StarPO-S group filtering by reward std, against hand-worked stds and rankings."""

from __future__ import annotations

import math

import pytest
import torch

from roll.algorithms.filters import group_reward_std_stats, select_groups_by_reward_std

F64 = torch.float64


def t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


# Nine rows in four interleaved groups:
#   row    0  1  2  3  4  5  6  7  8
#   group  p  q  r  p  s  r  q  p  s
#   score  0  5  0  1  0  4  5  2  2
# Unbiased stds: p = 0, 1, 2 -> mean 1, var (1 + 0 + 1) / 2 = 1, std 1.
#                q = 5, 5 -> std 0.
#                r = 0, 4 -> mean 2, var (4 + 4) / 1 = 8, std 2 * sqrt(2) = 2.83.
#                s = 0, 2 -> mean 1, var (1 + 1) / 1 = 2, std sqrt(2) = 1.41.
# Ranking by std: r, s, p, q. Rows: p = 0, 3, 7; q = 1, 6; r = 2, 5; s = 4, 8.
GROUPS = ["p", "q", "r", "p", "s", "r", "q", "p", "s"]
SCORES = t([0, 5, 0, 1, 0, 4, 5, 2, 2])


@pytest.mark.parametrize(
    ("keep_ratio", "expected_rows"),
    [
        (0.25, [2, 5]),  # ceil(1) = 1 group: r
        (0.5, [2, 4, 5, 8]),  # ceil(2) = 2 groups: r, s
        (0.6, [0, 2, 3, 4, 5, 7, 8]),  # ceil(2.4) = 3 groups: r, s, p
        (1.0, list(range(9))),  # every row
        (0.1, [2, 5]),  # ceil(0.4) = 1: at least one group (RAGEN's int() would keep none)
    ],
)
def test_keeps_the_groups_of_largest_std(keep_ratio, expected_rows):
    assert select_groups_by_reward_std(SCORES, GROUPS, keep_ratio=keep_ratio) == expected_rows


def test_tensor_ids_give_the_same_rows():
    ids = torch.tensor([7, 8, 9, 7, 6, 9, 8, 7, 6])  # p=7, q=8, r=9, s=6
    assert select_groups_by_reward_std(SCORES, ids, keep_ratio=0.5) == [2, 4, 5, 8]


def test_ties_are_broken_by_first_appearance():
    # u = 5, 7 and v = 3, 5: both mean +-1 deviations, var 2, std sqrt(2) exactly.
    # w = 0, 1: std sqrt(0.5). x = 2 alone: std 0.
    scores = t([5, 3, 0, 2, 7, 5, 1])
    ids = ["u", "v", "w", "x", "u", "v", "w"]
    assert select_groups_by_reward_std(scores, ids, keep_ratio=0.25) == [0, 4]  # u first
    assert select_groups_by_reward_std(scores, ids, keep_ratio=0.5) == [0, 1, 4, 5]
    # The same rows with v appearing first: v wins the tie.
    scores_v_first = t([3, 5, 0, 2, 7, 5, 1])
    ids_v_first = ["v", "u", "w", "x", "u", "v", "w"]
    assert select_groups_by_reward_std(scores_v_first, ids_v_first, keep_ratio=0.25) == [0, 5]


def test_singletons_and_equal_scores_rank_last_tied_at_zero():
    # y = 0.1 three times: std exactly 0 here, although torch.std gives about 1.7e-17.
    # z = 4 alone: std 0. g = 1, 2: std sqrt(0.5). y appears before z, so y wins the tie at 0.
    scores = t([0.1, 4, 0.1, 1, 0.1, 2])
    ids = ["y", "z", "y", "g", "y", "g"]
    assert float(t([0.1, 0.1, 0.1]).std()) > 0  # the rounding this guards against
    assert select_groups_by_reward_std(scores, ids, keep_ratio=1 / 3) == [3, 5]  # 1 group: g
    assert select_groups_by_reward_std(scores, ids, keep_ratio=0.5) == [0, 2, 3, 4, 5]  # g, y
    # z before y: now z wins the tie.
    scores_z_first = t([4, 0.1, 0.1, 1, 0.1, 2])
    ids_z_first = ["z", "y", "y", "g", "y", "g"]
    assert select_groups_by_reward_std(scores_z_first, ids_z_first, keep_ratio=0.5) == [0, 3, 5]


def test_float_rounding_of_the_ratio_does_not_keep_an_extra_group():
    # 25 groups of two rows, group k = (0, k) with std k / sqrt(2), so the largest stds are the
    # last groups. 0.28 * 25 is 7.000000000000001 in floats; ceil of it would keep 8 groups.
    scores = t([value for k in range(25) for value in (0, k)])
    ids = [k for k in range(25) for _ in range(2)]
    assert 0.28 * 25 > 7
    kept = select_groups_by_reward_std(scores, ids, keep_ratio=0.28)
    assert kept == list(range(2 * 18, 2 * 25))  # groups 18..24


@pytest.mark.parametrize("keep_ratio", [0.0, -0.5, 1.5, math.nan])
def test_keep_ratio_outside_zero_one_is_refused(keep_ratio):
    with pytest.raises(ValueError, match="keep_ratio must be in"):
        select_groups_by_reward_std(SCORES, GROUPS, keep_ratio=keep_ratio)


def test_mismatched_or_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="got 8 group_ids for 9 scores"):
        select_groups_by_reward_std(SCORES, GROUPS[:8], keep_ratio=0.5)
    with pytest.raises(ValueError, match="must be 1-D"):
        group_reward_std_stats(SCORES[None], GROUPS)
    with pytest.raises(ValueError, match="at least one sample"):
        group_reward_std_stats(t([]), [])


def test_empty_batch_keeps_nothing():
    assert select_groups_by_reward_std(t([]), [], keep_ratio=0.5) == []


def test_stats_count_groups_with_variance_and_average_their_std():
    # p, r, s vary and q does not: 3 / 4. Mean std (1 + 0 + 2 sqrt(2) + sqrt(2)) / 4. q is flat at
    # the batch's best score (5), so no group is flat below it.
    stats = group_reward_std_stats(SCORES, GROUPS)
    assert stats == {
        "rollout/groups_with_variance": 0.75,
        "rollout/in_group_std": pytest.approx((1 + 3 * math.sqrt(2)) / 4),
        "rollout/flat_groups_below_best": 0.0,
    }
    # 0.1 three times and a singleton: no group varies, and both stds are exactly 0; y is flat
    # below the best (4), the singleton z is the best.
    flat = group_reward_std_stats(t([0.1, 0.1, 0.1, 4]), ["y", "y", "y", "z"])
    assert flat == {
        "rollout/groups_with_variance": 0.0,
        "rollout/in_group_std": 0.0,
        "rollout/flat_groups_below_best": 0.5,
    }
