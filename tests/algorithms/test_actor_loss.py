"""The actor's whole loss from its options (roll.algorithms.actor_loss), on hand-derived numbers."""

from __future__ import annotations

import math

import pytest
import torch

from roll.algorithms.actor_loss import PolicyLossOptions, actor_loss
from roll.core.fields import Batch

F64 = torch.float64
# one row, two generated tokens; the policy has not moved (ratio 1 on both)
LOGPROBS = torch.zeros(1, 2, dtype=F64)
ENTROPY = torch.tensor([[0.5, 1.5]], dtype=F64)
MICRO = {
    Batch.RESPONSE_MASK: torch.ones(1, 2, dtype=F64),
    Batch.ADVANTAGES: torch.tensor([[1.0, -2.0]], dtype=F64),
    Batch.REF_LOGPROBS: torch.zeros(1, 2, dtype=F64),
    Batch.INFER_LOGPROBS: torch.full((1, 2), -math.log(2), dtype=F64),
}


def test_policy_loss_minus_the_entropy_bonus_plus_the_kl_loss():
    # PPO at ratio 1: token losses -A = [-1, 2], token-mean 0.5; entropy mean 1.0 times 0.1;
    # reference = policy: KL 0, so kl_coef adds nothing
    options = PolicyLossOptions(entropy_coef=0.1, kl_coef=1.0)
    loss, metrics = actor_loss(LOGPROBS, ENTROPY, LOGPROBS, MICRO, options)
    assert loss.item() == pytest.approx(0.5 - 0.1)
    assert metrics["losses/policy_loss"] == pytest.approx(0.5)
    assert metrics["losses/entropy"] == pytest.approx(1.0)
    assert metrics["losses/kl_loss"] == 0.0


def test_truncated_importance_weights_scale_the_policy_term():
    # the engine's log-probs are ln 2 below the old ones: every weight is 2 (under cap 4)
    options = PolicyLossOptions(entropy_coef=0.1, tis_level="token", tis_cap=4.0)
    loss, metrics = actor_loss(LOGPROBS, ENTROPY, LOGPROBS, MICRO, options)
    assert loss.item() == pytest.approx(2 * 0.5 - 0.1)
    assert metrics["actor/tis_weight_mean"] == pytest.approx(2.0)


def test_batch_fields_name_what_the_options_read():
    assert PolicyLossOptions().batch_fields(takes_old=False, has_versions=True) == (Batch.OLD_LOGPROBS,)
    assert PolicyLossOptions().batch_fields(takes_old=True, has_versions=False) == (Batch.INFER_LOGPROBS,)
    correction = {"is_weight": None, "filters": []}
    options = PolicyLossOptions(variant="topr", kl_coef=0.1, correction=correction)
    assert options.batch_fields(takes_old=False, has_versions=True) == (
        Batch.INFER_LOGPROBS,
        Batch.OLD_LOGPROBS,
        "episode_scores",
        Batch.REF_LOGPROBS,
        Batch.POLICY_VERSION,
    )


def test_a_scheduled_entropy_bonus_is_the_schedules_weight_at_the_step():
    # cosine over 200 steps: 0.1 at step 1, 0.05 at step 101 (cos pi/2 = 0); the loss at step 101
    # is the PPO term 0.5 minus 0.05 x entropy 1.0
    options = PolicyLossOptions(entropy_coef=0.1, entropy_schedule="cosine", max_steps=200)
    assert options.at_step(1).entropy_coef == pytest.approx(0.1)
    at_101 = options.at_step(101)
    assert at_101.entropy_coef == pytest.approx(0.05) and at_101.entropy_schedule == "constant"
    loss, _ = actor_loss(LOGPROBS, ENTROPY, LOGPROBS, MICRO, at_101)
    assert loss.item() == pytest.approx(0.5 - 0.05)
    assert at_101.at_step(150) is at_101  # a step's options are fixed: applying a step again changes nothing
    constant = PolicyLossOptions(entropy_coef=0.1)
    assert constant.at_step(150) is constant
