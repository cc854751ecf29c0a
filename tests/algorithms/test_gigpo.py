"""Step-wise advantage estimators (GiGPO, step REINFORCE, step GRPO) against hand-worked numbers."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from roll.algorithms.gigpo import (
    anchor_group_stats,
    broadcast_to_tokens,
    compute_gigpo_advantages,
    compute_step_grpo_advantages,
    compute_step_reinforce_advantages,
)

F64 = torch.float64
EPS = 1e-6


def t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


# One row per env step. Group A: trajectories a1 (3 steps), a2 (2 steps), a3 (1 step);
# group B: the single trajectory b1 (2 steps). The start states differ only to exercise the
# anchor grouping; nothing assumes a common start. Episode scores are given (e.g. success), not
# summed from the step rewards.
#   row  group traj step state  r_t   R(tau)
#    0     A    a1    0   s0   -0.5    3
#    1     A    a1    1   s1    1      3
#    2     A    a1    2   s2    0      3
#    3     A    a2    0   s1    2      1
#    4     A    a2    1   s0    2      1
#    5     A    a3    0   s1    2      2
#    6     B    b1    0   s1    1      5     <- s1 again, but in group B: never pooled with A
#    7     B    b1    1   s3    1      5
# Anchor groups: A/s1 = rows 1, 3, 5 (three trajectories, steps 1 and 0), A/s0 = rows 0, 4
# (steps 0 and 1), singletons A/s2 (row 2), B/s1 (row 6), B/s3 (row 7).
GROUPS = ["A", "A", "A", "A", "A", "A", "B", "B"]
TRAJS = ["a1", "a1", "a1", "a2", "a2", "a3", "b1", "b1"]
STEPS = [0, 1, 2, 0, 1, 0, 0, 1]
STATES = ["s0", "s1", "s2", "s1", "s0", "s1", "s1", "s3"]
REWARDS = t([-0.5, 1, 0, 2, 2, 2, 1, 1])
SCORES = t([3, 3, 3, 1, 1, 2, 5, 5])

# Step returns R_t = r_t + gamma * R_{t+1}, by trajectory:
#   gamma = 0.5: a1: R2 = 0, R1 = 1 + 0.5*0 = 1, R0 = -0.5 + 0.5*1 = 0; a2: R1 = 2,
#                R0 = 2 + 0.5*2 = 3; a3: R0 = 2; b1: R1 = 1, R0 = 1 + 0.5*1 = 1.5
#   gamma = 1:   a1: 0, 1, 0.5 (from the end: 0, 1 + 0, -0.5 + 1); a2: 4, 2; a3: 2; b1: 2, 1
RETURNS_HALF = t([0, 1, 0, 3, 2, 2, 1.5, 1])
RETURNS_ONE = t([0.5, 1, 0, 4, 2, 2, 2, 1])

# Episode part. Group A over its 3 trajectories: scores 3, 1, 2 -> mean 2, deviations 1, -1, 0,
# unbiased var (1 + 1 + 0) / 2 = 1. Every row of a trajectory gets its trajectory's value.
# (Averaging over the 6 rows instead, as ROLL's port does, would give mean 13/6 and a3 -1/6.)
# Group B has one trajectory: 0.
EPISODE = t([1, 1, 1, -1, -1, 0, 0, 0])
EPISODE_STD = EPISODE / (1 + EPS)

# Step part, gamma = 0.5. A/s1: returns 1, 3, 2 (rows 1, 3, 5) -> mean 2, deviations -1, 1, 0,
# var 1. A/s0: returns 0, 2 (rows 0, 4) -> mean 1, deviations -1, 1, var (1 + 1) / 1 = 2.
STEP_HALF = t([-1, -1, 0, 1, 1, 0, 0, 0])
R2 = math.sqrt(2)
STEP_HALF_STD = t([-1 / (R2 + EPS), -1 / (1 + EPS), 0, 1 / (1 + EPS), 1 / (R2 + EPS), 0, 0, 0])

# Step part, gamma = 1. A/s1: returns 1, 4, 2 -> mean 7/3, deviations -4/3, 5/3, -1/3,
# var (16 + 25 + 1) / 9 / 2 = 7/3. A/s0: returns 0.5, 2 -> mean 1.25, deviations -0.75, 0.75,
# var 2 * 0.5625 = 1.125.
STEP_ONE = t([-0.75, -4 / 3, 0, 5 / 3, 0.75, -1 / 3, 0, 0])
S1, S0 = math.sqrt(7 / 3) + EPS, math.sqrt(1.125) + EPS
STEP_ONE_STD = t([-0.75 / S0, -4 / 3 / S1, 0, 5 / 3 / S1, 0.75 / S0, -1 / 3 / S1, 0, 0])


def gigpo(**kwargs) -> torch.Tensor:
    return compute_gigpo_advantages(SCORES, REWARDS, GROUPS, TRAJS, STATES, STEPS, **kwargs)


@pytest.mark.parametrize(("norm_std", "expected"), [(False, EPISODE), (True, EPISODE_STD)])
def test_episode_part_counts_each_trajectory_once(norm_std, expected):
    assert_close(gigpo(gamma=0.5, step_weight=0.0, norm_std=norm_std), expected)


@pytest.mark.parametrize(
    ("gamma", "norm_std", "expected"),
    [
        (0.5, False, STEP_HALF),
        (0.5, True, STEP_HALF_STD),
        (1.0, False, STEP_ONE),
        (1.0, True, STEP_ONE_STD),
    ],
)
def test_step_part_compares_returns_within_anchor_states(gamma, norm_std, expected):
    assert_close(gigpo(gamma=gamma, episode_weight=0.0, norm_std=norm_std), expected)


def test_episode_and_step_parts_are_weighted_and_summed():
    # Defaults (weights 1, no std), gamma = 1: EPISODE + STEP_ONE.
    assert_close(gigpo(gamma=1.0), t([0.25, -1 / 3, 1, 2 / 3, -0.25, -1 / 3, 0, 0]))
    # 2 * EPISODE + 0.5 * STEP_HALF.
    weighted = gigpo(gamma=0.5, episode_weight=2.0, step_weight=0.5)
    assert_close(weighted, t([1.5, 1.5, 2, -1.5, -1.5, 0, 0, 0]))


def test_same_state_in_another_group_is_not_pooled():
    # Pooled, A/s1 would hold returns 1, 3, 2, 1.5 (mean 1.875) and row 6 would get -0.375.
    alone_a = compute_gigpo_advantages(SCORES[:6], REWARDS[:6], GROUPS[:6], TRAJS[:6], STATES[:6], STEPS[:6], gamma=0.5)
    assert_close(alone_a, EPISODE[:6] + STEP_HALF[:6])
    alone_b = compute_gigpo_advantages(SCORES[6:], REWARDS[6:], GROUPS[6:], TRAJS[6:], STATES[6:], STEPS[6:], gamma=0.5)
    assert_close(alone_b, t([0, 0]))
    assert_close(gigpo(gamma=0.5)[6:], t([0, 0]))


def test_shuffled_rows_and_tensor_ids_give_the_same_per_row_result():
    order = [7, 3, 0, 5, 2, 6, 4, 1]
    # The same ids as integer tensors: groups A=0, B=1; a1..b1 = 10..13; s0..s3 = 100..103.
    groups = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1])[order]
    trajs = torch.tensor([10, 10, 10, 11, 11, 12, 13, 13])[order]
    states = torch.tensor([100, 101, 102, 101, 100, 101, 101, 103])[order]
    steps = torch.tensor(STEPS)[order]
    shuffled = compute_gigpo_advantages(
        SCORES[order], REWARDS[order], groups, trajs, states, steps, gamma=0.5, norm_std=True
    )
    assert_close(shuffled, (EPISODE_STD + STEP_HALF_STD)[order])


def test_groups_without_spread_get_exactly_zero():
    # Group C: three one-step trajectories, all scoring 0.1 and all in state "s": the float mean
    # of 0.1, 0.1, 0.1 is 0.1 + 2.8e-17, and that rounding over a std of the same size would be
    # about -0.8. Group D: a single trajectory, whose std is 0 / 0 with eps = 0.
    scores = t([0.1, 0.1, 0.1, 7.0])
    advantages = compute_gigpo_advantages(
        scores,
        scores,
        ["C", "C", "C", "D"],
        ["c1", "c2", "c3", "d1"],
        ["s", "s", "s", "s"],
        [0, 0, 0, 0],
        gamma=1.0,
        norm_std=True,
        eps=0.0,
    )
    assert torch.equal(advantages, torch.zeros(4, dtype=F64))


def test_step_grpo_is_gigpo_without_the_step_part():
    grpo = compute_step_grpo_advantages(SCORES, GROUPS, TRAJS)
    assert_close(grpo, EPISODE_STD)
    assert_close(grpo, gigpo(gamma=0.5, step_weight=0.0, norm_std=True))
    assert_close(compute_step_grpo_advantages(SCORES, GROUPS, TRAJS, norm_std=False), EPISODE)


def test_list_inputs_give_the_default_float_dtype():
    # Integer scores 3, 1 over one group: mean 2, unbiased std sqrt(2).
    grpo = compute_step_grpo_advantages([3, 3, 1], ["g", "g", "g"], ["x", "x", "y"])
    expected = torch.tensor([1, 1, -1], dtype=torch.float32) / (R2 + EPS)
    assert_close(grpo, expected)


@pytest.mark.parametrize(("gamma", "expected"), [(0.5, RETURNS_HALF), (1.0, RETURNS_ONE)])
def test_step_reinforce_returns_without_normalisation(gamma, expected):
    returns = compute_step_reinforce_advantages(REWARDS, TRAJS, STEPS, gamma=gamma, normalize=False)
    assert_close(returns, expected)


def test_step_reinforce_whitens_over_rows():
    # Rows shuffled: t2 (r = 3), then t1 step 1 (r = 2), then t1 step 0 (r = 0). gamma = 0.5:
    # returns 3, 2, 0 + 0.5 * 2 = 1 -> mean 2, unbiased std 1.
    advantages = compute_step_reinforce_advantages(t([3, 2, 0]), ["t2", "t1", "t1"], [0, 1, 0], gamma=0.5)
    assert_close(advantages, t([1, 0, -1]) / (1 + EPS))
    # Returns 2, 2: no spread, so 0 rather than rounding noise; and one row alone is 0 too.
    equal = compute_step_reinforce_advantages(t([2, 2]), ["u", "v"], [0, 0], gamma=0.5)
    assert torch.equal(equal, torch.zeros(2, dtype=F64))
    single = compute_step_reinforce_advantages(t([4]), ["u"], [0], gamma=0.5)
    assert torch.equal(single, torch.zeros(1, dtype=F64))


@pytest.mark.parametrize(
    ("steps", "trajs"),
    [
        ([0, 2], ["x", "x"]),  # a gap: step 1 is missing
        ([0, 0], ["x", "x"]),  # the same step twice
        ([1], ["x"]),  # does not start at 0
        ([-1, 0], ["x", "x"]),
    ],
)
def test_incomplete_trajectories_are_refused(steps, trajs):
    with pytest.raises(ValueError, match="steps 0..L-1 each once"):
        compute_step_reinforce_advantages(t([1.0] * len(steps)), trajs, steps, gamma=1.0)


def test_inconsistent_rows_are_refused():
    with pytest.raises(ValueError, match="share one episode score"):
        compute_step_grpo_advantages(t([1, 2]), ["g", "g"], ["x", "x"])
    with pytest.raises(ValueError, match="share one traj_group_id"):
        compute_step_grpo_advantages(t([1, 1]), ["g", "h"], ["x", "x"])
    with pytest.raises(ValueError, match="traj_ids has 7 entries for 8 step rows"):
        compute_gigpo_advantages(SCORES, REWARDS, GROUPS, TRAJS[:7], STATES, STEPS, gamma=1.0)
    with pytest.raises(ValueError, match="step_rewards has 7 entries"):
        compute_gigpo_advantages(SCORES, REWARDS[:7], GROUPS, TRAJS, STATES, STEPS, gamma=1.0)


def test_empty_batch_gives_empty_advantages():
    advantages = compute_gigpo_advantages(t([]), t([]), [], [], [], [], gamma=1.0, norm_std=True)
    assert advantages.shape == (0,)


def test_broadcast_to_tokens_fills_generated_tokens_only():
    mask = t([[0, 1, 1], [1, 0, 0]])
    assert_close(broadcast_to_tokens(t([1.5, -2]), mask), t([[0, 1.5, 1.5], [-2, 0, 0]]))
    with pytest.raises(ValueError, match="disagree"):
        broadcast_to_tokens(t([1.5]), mask)


def test_anchor_group_stats_by_hand():
    # group g: states a, a, b (anchor groups {a: 2 rows}, {b: 1}); group h: state a (its own group)
    stats = anchor_group_stats(["g", "g", "g", "h"], ["a", "a", "b", "a"])
    assert stats == {"nonsingleton_frac": 0.5, "mean_size": (2 + 2 + 1 + 1) / 4, "num_groups": 3.0}
    assert anchor_group_stats([], []) == {"nonsingleton_frac": 0.0, "mean_size": 0.0, "num_groups": 0.0}


def test_a_virtual_best_score_makes_a_group_that_all_failed_negative():
    # NGRPO's calibration, one virtual trajectory scoring 1 per group. Group F: three one-step
    # failures (0, 0, 0) -> values 0 0 0 1: mean 1/4, deviations -1/4, unbiased std
    # sqrt((3/16 + 9/16) / 3) = 1/2 -> -1/2 each. Group W: two wins (1, 1) -> 1 1 1, no spread -> 0.
    # Group M: a win and a failure (1, 0) -> 1 0 1: mean 2/3, std sqrt((1/9 + 4/9 + 1/9) / 2)
    # = 1/sqrt(3) -> +1/sqrt(3), -2/sqrt(3). Group S: one failure -> 0 1: mean 1/2, std 1/sqrt(2)
    # -> -1/sqrt(2) (without the virtual score a group of one gets 0).
    scores = [0, 0, 0, 1, 1, 1, 0, 0]
    groups = ["F", "F", "F", "W", "W", "M", "M", "S"]
    trajs = ["f1", "f2", "f3", "w1", "w2", "m1", "m2", "s1"]
    calibrated = compute_step_grpo_advantages(scores, groups, trajs, virtual_score=1.0, eps=0.0)
    r3 = math.sqrt(3)
    expected = [-0.5, -0.5, -0.5, 0.0, 0.0, 1 / r3, -2 / r3, -1 / R2]
    assert_close(calibrated, torch.tensor(expected, dtype=calibrated.dtype))
    plain = compute_step_grpo_advantages(scores, groups, trajs, eps=0.0)
    assert plain[:5].abs().max() == 0 and plain[7] == 0  # the flat groups and the singleton
    # Without the std: the deviations from the mean that counts the virtual trajectory.
    centred = compute_step_grpo_advantages(scores, groups, trajs, norm_std=False, virtual_score=1.0)
    expected = [-0.25, -0.25, -0.25, 0.0, 0.0, 1 / 3, -2 / 3, -0.5]
    assert_close(centred, torch.tensor(expected, dtype=centred.dtype))


def test_the_virtual_score_counts_once_per_group_and_only_in_the_episode_part():
    # Group G: trajectory x of two steps and y of one, both failed (0): per trajectory 0 0 1 ->
    # mean 1/3, std sqrt((1/9 + 1/9 + 4/9) / 2) = 1/sqrt(3), each row -(1/3) * sqrt(3). Had the
    # rows been counted, x's two rows would make it 0 0 0 1 (-1/2). Every state differs, so the
    # anchor-state part is 0 and GiGPO equals its episode part.
    scores, rewards = t([0, 0, 0]), t([0, 0, 0])
    args = (scores, rewards, ["G"] * 3, ["x", "x", "y"], ["s0", "s1", "s2"], [0, 1, 0])
    advantages = compute_gigpo_advantages(*args, gamma=1.0, norm_std=True, virtual_score=1.0, eps=0.0)
    assert_close(advantages, t([-1 / math.sqrt(3)] * 3))
    assert torch.equal(compute_gigpo_advantages(*args, gamma=1.0, norm_std=True, eps=0.0), torch.zeros(3, dtype=F64))
