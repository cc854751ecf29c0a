"""ROLL-style reward normalisation against hand-worked numbers, every mean/std combination."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from roll.algorithms.reward_norm import (
    ASYM_CLIP_RANGE,
    clip_symmetric,
    norm_types_for_method,
    normalize_rewards,
)

F64 = torch.float64
EPS = 1e-6


def t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


# Six rows, groups interleaved: a = rows 0, 2, 4 (3 members), b = rows 1, 5 (2), c = row 3 (1).
#   row    0  1  2  3  4  5
#   group  a  b  a  c  a  b
#   score  0  3  1  9  2  9
# Batch: mean 24 / 6 = 4; deviations -4 -1 -3 5 -2 5, squares 16 1 9 25 4 25 = 80,
#   unbiased var 80 / 5 = 16, std 4.
# Group a: 0, 1, 2 -> mean 1, deviations -1 0 1, var 2 / 2 = 1, std 1.
# Group b: 3, 9 -> mean 6, deviations -3 3, var 18 / 1 = 18, std 3 * sqrt(2).
# Group c: 9 alone -> mean 9, no std: divisor 1.
KEYS = ["a", "b", "a", "c", "a", "b"]
SCORES = t([0, 3, 1, 9, 2, 9])
BATCH_CENTRED = t([-4, -1, -3, 5, -2, 5])
GROUP_CENTRED = t([-1, -3, 0, 0, 1, 3])
BATCH_DIV = 4 + EPS
A_DIV, B_DIV, C_DIV = 1 + EPS, 3 * math.sqrt(2) + EPS, 1.0
GROUP_DIV = t([A_DIV, B_DIV, A_DIV, C_DIV, A_DIV, B_DIV])

CASES = [
    (None, None, SCORES),
    ("batch", None, BATCH_CENTRED),
    ("group", None, GROUP_CENTRED),
    (None, "batch", SCORES / BATCH_DIV),
    ("batch", "batch", BATCH_CENTRED / BATCH_DIV),
    ("group", "batch", GROUP_CENTRED / BATCH_DIV),
    # The singleton c keeps its raw 9 (ROLL would give 0).
    (None, "group", t([0, 3 / B_DIV, 1 / A_DIV, 9, 2 / A_DIV, 9 / B_DIV])),
    # c: 9 - 4 = 5 over divisor 1 (ROLL would give 0).
    ("batch", "group", t([-4 / A_DIV, -1 / B_DIV, -3 / A_DIV, 5, -2 / A_DIV, 5 / B_DIV])),
    ("group", "group", t([-1 / A_DIV, -3 / B_DIV, 0, 0, 1 / A_DIV, 3 / B_DIV])),
]


@pytest.mark.parametrize(("mean_type", "std_type", "expected"), CASES)
def test_every_mean_and_std_combination(mean_type, std_type, expected):
    normalized = normalize_rewards(SCORES, KEYS, norm_mean_type=mean_type, norm_std_type=std_type)
    assert normalized.dtype == F64
    assert_close(normalized, expected)


def test_one_constant_key_makes_group_statistics_the_batch_statistics():
    # grouping "batch": the caller passes one key for every row.
    pairs = [(("group", "group"), ("batch", "batch")), (("group", None), ("batch", None))]
    pairs.append(((None, "group"), (None, "batch")))
    for (group_mean, group_std), (batch_mean, batch_std) in pairs:
        as_group = normalize_rewards(SCORES, ["batch"] * 6, norm_mean_type=group_mean, norm_std_type=group_std)
        as_batch = normalize_rewards(SCORES, KEYS, norm_mean_type=batch_mean, norm_std_type=batch_std)
        assert_close(as_group, as_batch)


def test_numpy_and_tensor_keys_group_like_the_list():
    expected = CASES[-1][2]
    as_numpy = np.array(KEYS, dtype=object)
    as_tensor = torch.tensor([0, 1, 0, 2, 0, 1])
    for keys in (as_numpy, as_tensor):
        normalized = normalize_rewards(SCORES, keys, norm_mean_type="group", norm_std_type="group")
        assert_close(normalized, expected)


def test_groups_without_spread_divide_by_one_and_centre_to_exactly_zero():
    # Group e: 0.1 three times; the float mean rounds to 0.1 + 1.4e-17, so the centred values
    # are set to 0 rather than left as -1.4e-17, and the std (1.7e-17 by torch.std) is replaced
    # by a divisor of 1. Group f: 0.5 alone.
    scores = t([0.1, 0.1, 0.1, 0.5])
    keys = ["e", "e", "e", "f"]
    centred = normalize_rewards(scores, keys, norm_mean_type="group", norm_std_type="group")
    assert torch.equal(centred, torch.zeros(4, dtype=F64))
    scaled_only = normalize_rewards(scores, keys, norm_mean_type=None, norm_std_type="group")
    assert torch.equal(scaled_only, scores)
    # Batch mean 0.8 / 4 = 0.2; both group divisors are 1, so the batch-centred values come
    # through unscaled.
    batch_centred = normalize_rewards(scores, keys, norm_mean_type="batch", norm_std_type="group")
    assert_close(batch_centred, t([-0.1, -0.1, -0.1, 0.3]))


def test_a_batch_of_one_or_of_equal_scores_is_left_unscaled():
    one = normalize_rewards(t([2.5]), ["x"], norm_mean_type=None, norm_std_type="batch")
    assert torch.equal(one, t([2.5]))
    equal = normalize_rewards(t([3, 3]), ["x", "y"], norm_mean_type="batch", norm_std_type="batch")
    assert torch.equal(equal, t([0, 0]))


def test_integer_scores_become_floats_and_eps_is_used():
    # Scores 1, 3 in one group: mean 2, deviations -1, 1, std sqrt(2); eps = 0.5.
    normalized = normalize_rewards(
        torch.tensor([1, 3]), ["g", "g"], norm_mean_type="group", norm_std_type="group", eps=0.5
    )
    expected = torch.tensor([-1, 1], dtype=torch.float32) / (math.sqrt(2) + 0.5)
    assert_close(normalized, expected)


def test_empty_batch_gives_empty_result():
    empty = normalize_rewards(t([]), [], norm_mean_type="group", norm_std_type="batch")
    assert empty.shape == (0,)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="norm_mean_type must be one of"):
        normalize_rewards(SCORES, KEYS, norm_mean_type="running", norm_std_type=None)
    with pytest.raises(ValueError, match="norm_std_type must be one of"):
        normalize_rewards(SCORES, KEYS, norm_mean_type=None, norm_std_type="std")
    with pytest.raises(ValueError, match="got 5 group_ids for 6 scores"):
        normalize_rewards(SCORES, KEYS[:5], norm_mean_type="group", norm_std_type=None)
    with pytest.raises(ValueError, match="must be 1-D"):
        normalize_rewards(SCORES[None], KEYS, norm_mean_type="group", norm_std_type=None)


@pytest.mark.parametrize(
    ("method", "batch_types", "group_types"),
    [
        ("identity", (None, None), (None, None)),
        ("mean", ("batch", None), ("group", None)),
        ("mean_std", ("batch", "batch"), ("group", "group")),
        ("asym_clip", ("batch", "batch"), ("group", "group")),
    ],
)
def test_method_names_pairs_of_norm_types_as_roll(method, batch_types, group_types):
    assert norm_types_for_method(method, "batch") == batch_types
    for grouping in ("traj_group_id", "tags"):
        assert norm_types_for_method(method, grouping) == group_types


def test_asym_clip_clamps_normalised_scores_to_minus_1_and_3():
    # Group a: eleven 0s and one 12: mean 1, deviations -1 (x11) and 11, squares 11 + 121 = 132,
    # unbiased var 132 / 11 = 12, std sqrt(12) = 3.4641: the 12 becomes 11 / 3.4641 = 3.1754 -> 3,
    # the 0s -1 / 3.4641 = -0.288675. Group b mirrors it: the -12 becomes -3.1754 -> -1, 0s +0.288675.
    scores = t([0.0] * 11 + [12.0] + [0.0] * 11 + [-12.0])
    keys = ["a"] * 12 + ["b"] * 12
    divisor = math.sqrt(12) + EPS
    kwargs = {"norm_mean_type": "group", "norm_std_type": "group"}
    plain = normalize_rewards(scores, keys, **kwargs)
    assert plain[11].item() == pytest.approx(11 / divisor) and plain[11].item() > 3
    clipped = normalize_rewards(scores, keys, **kwargs, clip_range=ASYM_CLIP_RANGE)
    expected = t([-1 / divisor] * 11 + [3.0] + [1 / divisor] * 11 + [-1.0])
    assert_close(clipped, expected)


def test_clip_symmetric_reports_the_fraction_outside():
    # limit 2: -3 -> -2 and 5 -> 2 are outside (2 itself is not): 2 of 5; with the 5 masked, 1 of 4.
    values = t([-3.0, -1.0, 0.0, 2.0, 5.0])
    clipped, fraction = clip_symmetric(values, 2.0)
    assert clipped.tolist() == [-2.0, -1.0, 0.0, 2.0, 2.0] and fraction == pytest.approx(2 / 5)
    _, fraction = clip_symmetric(values, 2.0, mask=t([1, 1, 1, 1, 0]))
    assert fraction == pytest.approx(1 / 4)
