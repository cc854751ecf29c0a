"""Truncated importance weights against numbers worked out by hand, and their use in the loss."""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict
from torch.testing import assert_close

from roll.algorithms.actor_loss import PolicyLossOptions
from roll.algorithms.losses import ppo_policy_loss
from roll.algorithms.off_policy import tis_metrics, truncated_importance_weights
from roll.distributed.workers.actor import _policy_loss
from tests.conftest import tiny_llama

F64 = torch.float64
E = math.e

# B = 3, T = 4. Log-ratios old - infer:
#   row 0: 0.5 | -1 | ln 3 | 0.3 (observation: masked)
#   row 1: 0   | ln 0.5 | 0.7 (pad: masked) | 0 (pad)
#   row 2: no response token at all
INFER = torch.tensor([[-1.0, -1.0, -2.0, -1.0], [-0.5, -0.5, -1.0, -1.0], [-1.0, -1.0, -1.0, -1.0]], dtype=F64)
LOG_RATIO = torch.tensor(
    [[0.5, -1.0, math.log(3), 0.3], [0.0, math.log(0.5), 0.7, 0.0], [0.2, 0.2, 0.2, 0.2]], dtype=F64
)
OLD = INFER + LOG_RATIO
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=F64)


def test_token_level_weights_are_truncated_ratios():
    w = truncated_importance_weights(OLD, INFER, MASK, level="token", cap=2.0)
    # row 0: e^0.5, e^-1, min(3, 2) = 2, e^0.3 (masked, still a finite weight)
    expected = torch.tensor([[E**0.5, E**-1, 2.0, E**0.3], [1.0, 0.5, 2.0, 1.0], [E**0.2] * 4], dtype=F64)
    assert_close(w, expected)
    assert not w.requires_grad


def test_sequence_level_weight_is_the_truncated_product_over_the_row():
    w = truncated_importance_weights(OLD, INFER, MASK, level="sequence", cap=2.0)
    # row 0: exp(0.5 - 1 + ln 3) = 3 e^-0.5 = 1.8196 < 2; row 1: exp(0 + ln 0.5) = 0.5; row 2: exp(0) = 1
    expected = torch.tensor([[3 * E**-0.5] * 4, [0.5] * 4, [1.0] * 4], dtype=F64)
    assert_close(w, expected)
    capped = truncated_importance_weights(OLD, INFER, MASK, level="sequence", cap=1.5)
    assert_close(capped[0], torch.full((4,), 1.5, dtype=F64))


def test_a_huge_ratio_gives_the_cap_not_inf():
    w = truncated_importance_weights(
        torch.tensor([[0.0]]), torch.tensor([[-1000.0]]), torch.ones(1, 1), level="sequence", cap=3.0
    )
    assert w.item() == pytest.approx(3.0)


def test_metrics_count_response_tokens_only():
    w = truncated_importance_weights(OLD, INFER, MASK, level="token", cap=2.0)
    metrics = tis_metrics(w, MASK, cap=2.0)
    # the five response tokens: e^0.5, e^-1, 2 (at the cap), 1, 0.5
    assert metrics["actor/tis_weight_mean"] == pytest.approx((E**0.5 + E**-1 + 2 + 1 + 0.5) / 5)
    assert metrics["actor/tis_clipped_frac"] == pytest.approx(1 / 5)


@pytest.mark.parametrize("level, cap", [("tokens", 2.0), ("token", 0.0)])
def test_bad_level_or_cap_raises(level, cap):
    with pytest.raises(ValueError):
        truncated_importance_weights(OLD, INFER, MASK, level=level, cap=cap)


def test_weights_scale_each_token_of_the_policy_loss():
    # ratio 1 (logprobs == old), A = [1, -2], w = [0.5, 2]: token losses [-1, 2] * w = [-0.5, 4],
    # token-mean 1.75; d loss / d logprobs = -A r w / 2 = [-0.25, 2].
    logprobs = torch.zeros(1, 2, dtype=F64, requires_grad=True)
    weights = torch.tensor([[0.5, 2.0]], dtype=F64, requires_grad=True)
    loss, _ = ppo_policy_loss(
        logprobs,
        torch.zeros(1, 2, dtype=F64),
        torch.tensor([[1.0, -2.0]], dtype=F64),
        torch.ones(1, 2, dtype=F64),
        0.2,
        weights=weights,
    )
    assert loss.item() == pytest.approx(1.75)
    loss.backward()
    assert_close(logprobs.grad, torch.tensor([[-0.25, 2.0]], dtype=F64))
    assert weights.grad is None  # the weights are constants of the loss


def test_actor_loss_applies_the_weights():
    """Through the actor's loss function on a tiny model: the engine's log-probs are the trainer's
    minus ln 2 on every token, so every token weight is 2 (at cap 4) and the loss doubles."""
    model = tiny_llama(0, layers=1, vocab_size=16)
    ids = torch.randint(1, 16, (2, 6))
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1]], dtype=torch.float)
    old = torch.full((2, 6), -2.5)
    micro = TensorDict(
        {
            "input_ids": ids,
            "attention_mask": torch.ones(2, 6, dtype=torch.long),
            "response_mask": mask,
            "old_logprobs": old,
            "advantages": torch.ones(2, 6),
            "infer_logprobs": old - math.log(2),
        },
        batch_size=[2],
    )
    plain, plain_metrics = _policy_loss(model, micro, options=PolicyLossOptions(), dedupe=False)
    tis = PolicyLossOptions(tis_level="token", tis_cap=4.0)
    weighted, metrics = _policy_loss(model, micro, options=tis, dedupe=False)
    assert weighted.item() == pytest.approx(2 * plain.item(), rel=1e-6)
    assert metrics["actor/tis_weight_mean"] == pytest.approx(2.0) and metrics["actor/tis_clipped_frac"] == 0.0
    assert "actor/tis_weight_mean" not in plain_metrics
