"""Advantage estimators against numbers worked out by hand, plus the masked helpers they use."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from roll.algorithms.advantages import (
    ADV_ESTIMATORS,
    compute_advantages,
    compute_gae,
    compute_grpo_advantages,
    compute_reinforce_returns,
)
from roll.algorithms.utils import (
    compress,
    masked_mean,
    masked_var,
    masked_whiten,
    scatter,
)

F64 = torch.float64


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=F64)


# Two rows, T = 5.
# Row 0: gen, gen, OBS, gen, PAD  -> two turns; turn rewards 1.0 (pos 1) and 2.0 (pos 3).
# Row 1: PROMPT, gen, gen, PAD, PAD -> one turn; reward 3.0 at pos 2.
# Values on observation / prompt / padding positions are junk that must be ignored.
MASK = t([[1, 1, 0, 1, 0], [0, 1, 1, 0, 0]])
REWARDS = t([[0, 1, 0, 2, 0], [0, 0, 3, 0, 0]])
VALUES = t([[1, 2, 9, 4, 7], [5, 1, 2, 8, 8]])


def test_gae_skips_observation_tokens_and_ends_with_zero_value():
    # gamma = 0.5, lambd = 0.5, so gamma * lambd = 0.25.
    # Row 0, generated positions 0, 1, 3 with V = 1, 2, 4 and r = 0, 1, 2:
    #   pos 3 (last): delta = 2 + 0.5 * 0 - 4 = -2             A = -2
    #   pos 1: next is pos 3: delta = 1 + 0.5 * 4 - 2 = 1        A = 1 + 0.25 * -2 = 0.5
    #   pos 0: delta = 0 + 0.5 * 2 - 1 = 0                       A = 0 + 0.25 * 0.5 = 0.125
    #   returns = A + V: 1.125, 2.5, 2.0
    # Row 1, generated positions 1, 2 with V = 1, 2 and r = 0, 3:
    #   pos 2: delta = 3 + 0 - 2 = 1                             A = 1
    #   pos 1: delta = 0 + 0.5 * 2 - 1 = 0                       A = 0.25
    #   returns: 1.25, 3.0
    advantages, returns = compute_gae(REWARDS, VALUES, MASK, gamma=0.5, lambd=0.5)
    assert_close(advantages, t([[0.125, 0.5, 0, -2, 0], [0, 0.25, 1, 0, 0]]))
    assert_close(returns, t([[1.125, 2.5, 0, 2.0, 0], [0, 1.25, 3.0, 0, 0]]))


def test_gae_bootstraps_a_truncated_trajectory_and_not_a_terminated_one():
    # Two rows with the same tokens, rewards and values; row 0 was truncated (cut by max actions or
    # max tokens: the value of its last state is V_last = 6), row 1 terminated (V_last = 0).
    # gamma = 0.5, lambd = 0.5, so gamma * lambd = 0.25. Generated positions 1, 2 (position 0 is
    # the prompt, 3 an observation, 4 padding), V = 2, 4 and r = 0, 1.
    # Row 0 (truncated, bootstrap 6):
    #   pos 2 (last): delta = 1 + 0.5 * 6 - 4 = 0                A = 0
    #   pos 1: delta = 0 + 0.5 * 4 - 2 = 0                       A = 0 + 0.25 * 0 = 0
    #   returns = A + V: 2, 4
    # Row 1 (terminated, bootstrap 0):
    #   pos 2 (last): delta = 1 + 0.5 * 0 - 4 = -3               A = -3
    #   pos 1: delta = 0 + 0.5 * 4 - 2 = 0                       A = 0 + 0.25 * -3 = -0.75
    #   returns = A + V: 1.25, 1
    mask = t([[0, 1, 1, 0, 0]] * 2)
    rewards = t([[0, 0, 1, 0, 0]] * 2)
    values = t([[9, 2, 4, 7, 0]] * 2)
    last_state_values = t([6, 5])  # the critic's V of each row's last state
    truncated = torch.tensor([True, False])
    advantages, returns = compute_gae(rewards, values, mask, 0.5, 0.5, bootstrap_values=last_state_values * truncated)
    assert_close(advantages, t([[0, 0, 0, 0, 0], [0, -0.75, -3, 0, 0]]))
    assert_close(returns, t([[0, 2, 4, 0, 0], [0, 1.25, 1, 0, 0]]))
    # without a bootstrap both rows are treated as terminated (the old behaviour)
    advantages, _ = compute_gae(rewards, values, mask, 0.5, 0.5)
    assert_close(advantages[0], advantages[1])
    # the registry passes it through
    via_registry, _ = compute_advantages(
        "gae",
        token_rewards=rewards,
        values=values,
        response_mask=mask,
        gamma=0.5,
        lambd=0.5,
        bootstrap_values=last_state_values * truncated,
    )
    assert_close(via_registry, t([[0, 0, 0, 0, 0], [0, -0.75, -3, 0, 0]]))


def test_gae_is_unchanged_by_inserting_observation_tokens():
    # Same row 0 with its observation token removed: the generated tokens see the same recursion.
    advantages, returns = compute_gae(t([[0, 1, 2]]), t([[1, 2, 4]]), t([[1, 1, 1]]), 0.5, 0.5)
    assert_close(advantages, t([[0.125, 0.5, -2]]))
    assert_close(returns, t([[1.125, 2.5, 2.0]]))


def test_gae_with_lambda_one_and_zero_values_is_the_reward_to_go():
    advantages, returns = compute_gae(REWARDS, torch.zeros_like(VALUES), MASK, 0.5, 1.0)
    expected, _ = compute_reinforce_returns(REWARDS, MASK, 0.5)
    assert_close(advantages, expected)
    assert_close(returns, expected)


def test_reward_on_an_observation_token_is_refused():
    rewards = REWARDS.clone()
    rewards[0, 2] = 1.0  # position 2 of row 0 is an observation token
    with pytest.raises(ValueError, match="off response_mask"):
        compute_gae(rewards, VALUES, MASK, 0.5, 0.5)
    with pytest.raises(ValueError, match="off response_mask"):
        compute_reinforce_returns(rewards, MASK, 0.5)


def test_reinforce_discounts_per_generated_token_skipping_observations():
    # gamma = 0.5. Row 0 generated r = 0, 1, 2 at positions 0, 1, 3:
    #   G(3) = 2, G(1) = 1 + 0.5 * 2 = 2, G(0) = 0 + 0.5 * 2 = 1  (the OBS token is not a step)
    # Row 1 generated r = 0, 3 at positions 1, 2: G(2) = 3, G(1) = 1.5.
    advantages, returns = compute_reinforce_returns(REWARDS, MASK, gamma=0.5)
    expected = t([[1, 2, 0, 2, 0], [0, 1.5, 3, 0, 0]])
    assert_close(advantages, expected)
    assert_close(returns, expected)


# GRPO: groups a (3 members), b (2 members), c (1 member), interleaved in the batch.
GROUP_IDS = ["a", "b", "a", "c", "b", "a"]
SCORES = t([1, 1, 2, 5, 3, 3])
GRPO_MASK = t([[1, 1, 0], [0, 1, 1], [1, 0, 0], [1, 1, 1], [1, 1, 0], [0, 0, 1]])


def test_grpo_normalises_within_each_group():
    # a: scores 1, 2, 3 -> mean 2, unbiased var ((-1)^2 + 0 + 1^2) / 2 = 1, std 1
    #    -> A = -1 / (1 + eps), 0, 1 / (1 + eps)
    # b: scores 1, 3 -> mean 2, var (1 + 1) / 1 = 2, std sqrt(2) -> A = -+1 / (sqrt(2) + eps)
    # c: a group of one -> A = 0
    eps = 1e-6
    a, b = 1 / (1 + eps), 1 / (math.sqrt(2) + eps)
    per_sample = t([-a, -b, 0.0, 0.0, b, a])
    advantages, returns = compute_grpo_advantages(SCORES, GROUP_IDS, GRPO_MASK, eps=eps)
    assert_close(advantages, per_sample[:, None] * GRPO_MASK)
    assert_close(returns, SCORES[:, None] * GRPO_MASK)
    # The same groups given as a LongTensor.
    ids = torch.tensor([7, 3, 7, 0, 3, 7])
    advantages_from_tensor, _ = compute_grpo_advantages(SCORES, ids, GRPO_MASK, eps=eps)
    assert_close(advantages_from_tensor, advantages)


def test_grpo_without_std_keeps_only_the_mean_baseline():
    # a: 1 - 2, 2 - 2, 3 - 2; b: 1 - 2, 3 - 2; c: 5 - 5.
    advantages, _ = compute_grpo_advantages(SCORES, GROUP_IDS, GRPO_MASK, norm_by_std=False)
    assert_close(advantages, t([-1, -1, 0, 0, 1, 1])[:, None] * GRPO_MASK)


def test_grpo_group_with_equal_scores_gets_zero_not_nan():
    mask = torch.ones(3, 2, dtype=F64)
    advantages, _ = compute_grpo_advantages(t([4, 4, 4]), [0, 0, 0], mask)
    assert_close(advantages, torch.zeros(3, 2, dtype=F64))


def test_grpo_rejects_group_ids_of_the_wrong_length():
    with pytest.raises(ValueError, match="5 group_ids for 6 scores"):
        compute_grpo_advantages(SCORES, GROUP_IDS[:5], GRPO_MASK)


def test_registry_dispatches_by_name():
    assert set(ADV_ESTIMATORS) == {"gae", "grpo", "reinforce"}
    common = dict(response_mask=MASK, gamma=0.5, lambd=0.5, token_rewards=REWARDS, values=VALUES)
    advantages, returns = compute_advantages("gae", **common)
    assert_close(advantages, t([[0.125, 0.5, 0, -2, 0], [0, 0.25, 1, 0, 0]]))
    advantages, _ = compute_advantages("reinforce", **common)
    assert_close(advantages, t([[1, 2, 0, 2, 0], [0, 1.5, 3, 0, 0]]))
    advantages, _ = compute_advantages(
        "grpo",
        response_mask=GRPO_MASK,
        gamma=1.0,
        lambd=1.0,
        scores=SCORES,
        group_ids=GROUP_IDS,
        norm_by_std=False,
    )
    assert_close(advantages, t([-1, -1, 0, 0, 1, 1])[:, None] * GRPO_MASK)


def test_registry_names_unknown_estimators_and_missing_inputs():
    with pytest.raises(ValueError, match="'gigpo_typo'"):
        compute_advantages("gigpo_typo", response_mask=MASK, gamma=1.0, lambd=1.0)
    with pytest.raises(ValueError, match="'gae' needs values"):
        compute_advantages("gae", response_mask=MASK, gamma=1.0, lambd=1.0, token_rewards=REWARDS)


# Masked helpers. Masked entries of x: 1, 3, 5 (mean 3, unbiased var 4, biased var 8 / 3).
X = t([[1, 3, 100], [5, -7, 0]])
X_MASK = t([[1, 1, 0], [1, 0, 0]])


def test_masked_mean_and_var_ignore_unmasked_entries():
    assert_close(masked_mean(X, X_MASK), torch.tensor(3.0, dtype=F64))
    assert_close(masked_mean(X, X_MASK, dim=-1), t([2, 5]))
    assert_close(masked_var(X, X_MASK), torch.tensor(4.0, dtype=F64))
    assert_close(masked_var(X, X_MASK, unbiased=False), torch.tensor(8 / 3, dtype=F64))
    assert_close(masked_mean(X, torch.zeros_like(X)), torch.tensor(0.0, dtype=F64))
    with pytest.raises(ValueError, match="at least 2"):
        masked_var(X, t([[1, 0, 0], [0, 0, 0]]))


def test_masked_whiten_zeroes_unmasked_positions():
    # (x - 3) / 2 on masked entries; with shift_mean=False the mean 3 is added back.
    assert_close(masked_whiten(X, X_MASK, eps=0.0), t([[-1, 0, 0], [1, 0, 0]]))
    assert_close(masked_whiten(X, X_MASK, shift_mean=False, eps=0.0), t([[2, 3, 0], [4, 0, 0]]))


def test_compress_packs_masked_entries_left_and_scatter_restores_them():
    packed, packed_mask, index = compress(X, X_MASK)
    assert_close(packed, t([[1, 3], [5, 0]]))
    assert_close(packed_mask, t([[1, 1], [1, 0]]))
    assert_close(scatter(packed, index, 3), X * X_MASK)
