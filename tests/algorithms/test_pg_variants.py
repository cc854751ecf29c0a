"""The pg_variant losses against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from roll.algorithms.losses import ppo_policy_loss
from roll.algorithms.pg_variants import PG_VARIANTS, PGOptions, policy_gradient_loss

F64 = torch.float64

# B = 2 rows, T = 3 tokens; row 0's last token is masked out (its numbers must not count).
# log pi (L), ratio r = exp(L - L_old), advantage A, episode score:
#   row 0 (score 1, "positive"): L -1.0, -2.0, (-0.5) | r 1.5, 0.5, (2.0) | A 2, 2, (9)
#   row 1 (score 0, "negative"): L -0.5, -1.0, -2.0   | r 0.6, 1.4, 1.0   | A -1, -1, -1
# Every loss below is token-mean over the 5 generated tokens.
LOGPROBS = torch.tensor([[-1.0, -2.0, -0.5], [-0.5, -1.0, -2.0]], dtype=F64)
RATIOS = torch.tensor([[1.5, 0.5, 2.0], [0.6, 1.4, 1.0]], dtype=F64)
OLD_LOGPROBS = LOGPROBS - torch.log(RATIOS)
ADVANTAGES = torch.tensor([[2.0, 2.0, 9.0], [-1.0, -1.0, -1.0]], dtype=F64)
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=F64)
SCORES = torch.tensor([1.0, 0.0], dtype=F64)


def run(variant: str, options: PGOptions = PGOptions(), requires_grad: bool = False):
    logprobs = LOGPROBS.clone().requires_grad_(requires_grad)
    loss, metrics = policy_gradient_loss(
        variant, logprobs, OLD_LOGPROBS, ADVANTAGES, MASK, options=options, episode_scores=SCORES
    )
    return logprobs, loss, metrics


def test_vanilla_is_reinforce():
    # -A L: row 0: -2 * -1 = 2, -2 * -2 = 4; row 1: -(-1)(-0.5) = -0.5, -1, -2. Sum 2.5, mean 0.5.
    # d loss / d L = -A / 5 on generated tokens, 0 on the masked one.
    logprobs, loss, metrics = run("vanilla", requires_grad=True)
    assert loss.item() == pytest.approx(0.5)
    loss.backward()
    assert_close(logprobs.grad, torch.tensor([[-0.4, -0.4, 0.0], [0.2, 0.2, 0.2]], dtype=F64))
    assert metrics["losses/policy_loss"] == pytest.approx(0.5)
    assert metrics["losses/ratio_mean"] == pytest.approx((1.5 + 0.5 + 0.6 + 1.4 + 1.0) / 5)
    k3 = sum(r - 1 - math.log(r) for r in (1.5, 0.5, 0.6, 1.4, 1.0)) / 5
    assert metrics["losses/approx_kl"] == pytest.approx(k3)


def test_ppo_clips_the_ratio_to_the_trust_region():
    # clip 0.2 -> [0.8, 1.2]; token loss max(-r A, -clip(r) A):
    #   row 0 (A 2):  r 1.5: max(-3.0, -2.4) = -2.4 (clipped) | r 0.5: max(-1.0, -1.6) = -1.0
    #   row 1 (A -1): r 0.6: max(0.6, 0.8) = 0.8 (clipped) | r 1.4: max(1.4, 1.2) = 1.4 | r 1.0: 1.0
    # sum -0.2, mean -0.04; clipped taken 2/5; r < 0.8: 0.5, 0.6; r > 1.2: 1.5, 1.4.
    _, loss, metrics = run("ppo")
    assert loss.item() == pytest.approx(-0.04)
    assert metrics["losses/clipfrac"] == pytest.approx(2 / 5)
    assert metrics["actor/ppo_ratio_low_clipfrac"] == pytest.approx(2 / 5)
    assert metrics["actor/ppo_ratio_high_clipfrac"] == pytest.approx(2 / 5)
    assert metrics["actor/ppo_ratio_clipfrac"] == pytest.approx(4 / 5)
    reference, _ = ppo_policy_loss(LOGPROBS, OLD_LOGPROBS, ADVANTAGES, MASK, 0.2, 0.2)
    assert loss.item() == pytest.approx(reference.item())


def test_ppo_dual_clip_caps_the_loss_of_negative_advantages():
    # ROLL's dual_clip_loss with pg_clip 0.1: c = 1 + 2 * 0.1 = 1.2 (the ratio clip stays 0.2 here).
    # Row 1 (A -1) token losses 0.8, 1.4, 1.0 (test above) -> min(loss, -c A = 1.2): 0.8, 1.2, 1.0;
    # row 0 (A 2) is untouched. Sum -2.4 - 1.0 + 0.8 + 1.2 + 1.0 = -0.4, mean -0.08; capped 1/5.
    # Gradients (/5): the clipped (r 1.5, 0.6) and the capped (r 1.4) tokens have none;
    # r 0.5: d(-A r)/dL = -A r = -1.0; r 1.0: 1.0.
    logprobs, loss, metrics = run("ppo", PGOptions(dual_clip=1.2), requires_grad=True)
    assert loss.item() == pytest.approx(-0.08)
    assert metrics["actor/dual_clipfrac"] == pytest.approx(1 / 5)
    loss.backward()
    assert_close(logprobs.grad, torch.tensor([[0.0, -0.2, 0.0], [0.0, 0.0, 0.2]], dtype=F64))
    _, unbounded, _ = run("ppo", PGOptions(dual_clip=1.4))  # c = 1.4 = the largest row-1 loss: no cap
    assert unbounded.item() == pytest.approx(-0.04)


def test_tis_truncates_the_detached_ratio():
    # bounds [0, 1]: w = min(r, 1): row 0: 1, 0.5; row 1: 0.6, 1, 1. Token loss -w A L:
    #   row 0: -1 * 2 * -1 = 2, -0.5 * 2 * -2 = 2; row 1: -0.6 * -1 * -0.5 = -0.3, -1, -2.
    # sum 0.7, mean 0.14; r > 1 on 1.5 and 1.4: 2/5; mean w = 4.1 / 5. Gradient -w A / 5.
    logprobs, loss, metrics = run("tis", requires_grad=True)
    assert loss.item() == pytest.approx(0.14)
    loss.backward()
    assert_close(logprobs.grad, torch.tensor([[-0.4, -0.2, 0.0], [0.12, 0.2, 0.2]], dtype=F64))
    assert metrics["actor/tis_upper_clipfrac"] == pytest.approx(2 / 5)
    assert metrics["actor/tis_lower_clipfrac"] == 0.0
    assert metrics["actor/tis_total_clipfrac"] == pytest.approx(2 / 5)
    assert metrics["actor/tis_clipped_ratio_mean"] == pytest.approx(4.1 / 5)


def test_topr_keeps_positive_rows_plain_and_truncates_negative_ones():
    # row 0 (score 1 > 0): -A L = 2, 4 (sum 6). row 1 (score 0): -min(r, 1) A L = -0.3, -1, -2
    # (sum -3.3). Weights 1, 1: (6 - 3.3) / 5 = 0.54. Weights 0.5, 2: (3 - 6.6) / 5 = -0.72.
    # Truncated tokens of negative rows: r 1.4 -> 1/5.
    _, loss, metrics = run("topr")
    assert loss.item() == pytest.approx(0.54)
    assert metrics["actor/topr_positive_ratio"] == 0.5  # 1 row of 2
    assert metrics["actor/topr_negative_ratio"] == 0.5
    assert metrics["actor/topr_negative_total_clipfrac"] == pytest.approx(1 / 5)
    _, loss, _ = run("topr", PGOptions(topr_positive_weight=0.5, topr_negative_weight=2.0))
    assert loss.item() == pytest.approx(-0.72)


def test_topr_needs_episode_scores():
    with pytest.raises(ValueError, match="topr"):
        policy_gradient_loss("topr", LOGPROBS, OLD_LOGPROBS, ADVANTAGES, MASK)


def test_cispo_clips_the_weight_not_the_gradient():
    # eps 0.1 / 0.1 -> w = clip(r, 0.9, 1.1): row 0: 1.1, 0.9; row 1: 0.9, 1.1, 1.0.
    # -w A L: row 0: -1.1 * 2 * -1 = 2.2, -0.9 * 2 * -2 = 3.6; row 1: -0.9 * -1 * -0.5 = -0.45,
    # -1.1, -2.0. Sum 2.25, mean 0.45. Every token has a gradient, -w A / 5 (even clipped ones).
    # All four non-1 ratios are outside [0.9, 1.1]: lower 0.5, 0.6; upper 1.5, 1.4.
    logprobs, loss, metrics = run("cispo", requires_grad=True)
    assert loss.item() == pytest.approx(0.45)
    loss.backward()
    assert_close(logprobs.grad, torch.tensor([[-0.44, -0.36, 0.0], [0.18, 0.22, 0.2]], dtype=F64))
    assert metrics["actor/cispo_lower_clipfrac"] == pytest.approx(2 / 5)
    assert metrics["actor/cispo_upper_clipfrac"] == pytest.approx(2 / 5)
    assert metrics["actor/cispo_total_clipfrac"] == pytest.approx(4 / 5)
    assert metrics["actor/cispo_clipped_ratio_mean"] == pytest.approx(5.0 / 5)


def test_cispo_unified_mask_drops_tokens_outside_the_trust_region():
    # Eq. 7 drops (A > 0, r > 1.1): row 0 token 0; (A < 0, r < 0.9): row 1 token 0.
    # Kept: 3.6 - 1.1 - 2.0 = 0.5, mean over the 5 tokens 0.1; kept 3/5.
    _, loss, metrics = run("cispo", PGOptions(cispo_use_unified_mask=True))
    assert loss.item() == pytest.approx(0.1)
    assert metrics["actor/cispo_kept_tokens"] == pytest.approx(3 / 5)


def test_kimi15_adds_a_squared_log_ratio_penalty():
    # -A L sums to 2.5 (as vanilla); tau / 2 * (ln r)^2 with tau 0.1 adds 0.05 * sum (ln r)^2
    # = 0.05 * (ln 1.5^2 + ln 0.5^2 + ln 0.6^2 + ln 1.4^2 + 0) = 0.05 * 1.019012 = 0.050951.
    # Mean (2.5 + 0.050951) / 5 = 0.510190. Gradient -A / 5 + tau * ln r / 5.
    logs = [math.log(r) for r in (1.5, 0.5, 0.6, 1.4, 1.0)]
    logprobs, loss, metrics = run("kimi15", requires_grad=True)
    assert loss.item() == pytest.approx((2.5 + 0.05 * sum(x * x for x in logs)) / 5)
    assert loss.item() == pytest.approx(0.510190, abs=1e-6)
    loss.backward()
    expected = [[-0.4 + 0.02 * logs[0], -0.4 + 0.02 * logs[1], 0.0], [0.2 + 0.02 * logs[2], 0.2 + 0.02 * logs[3], 0.2]]
    assert_close(logprobs.grad, torch.tensor(expected, dtype=F64))
    assert metrics["actor/kimi15_log_ratio_abs_mean"] == pytest.approx(sum(abs(x) for x in logs) / 5)


def test_off_policy_weights_scale_every_variant():
    weights = torch.full_like(LOGPROBS, 0.5)
    for variant in PG_VARIANTS:
        plain, _ = policy_gradient_loss(variant, LOGPROBS, OLD_LOGPROBS, ADVANTAGES, MASK, episode_scores=SCORES)
        halved, _ = policy_gradient_loss(
            variant, LOGPROBS, OLD_LOGPROBS, ADVANTAGES, MASK, weights=weights, episode_scores=SCORES
        )
        assert halved.item() == pytest.approx(0.5 * plain.item()), variant


def test_unknown_variant_is_refused():
    with pytest.raises(ValueError, match="unknown pg_variant 'grpo'"):
        policy_gradient_loss("grpo", LOGPROBS, OLD_LOGPROBS, ADVANTAGES, MASK)
