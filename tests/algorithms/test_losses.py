"""PPO losses, loss aggregation and log-prob helpers against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from roll.algorithms.losses import (
    agg_loss,
    entropy_from_logits,
    logprobs_from_logits,
    ppo_policy_loss,
    row_chunks,
    value_loss,
)

F64 = torch.float64


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=F64)


def scalar(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=F64)


# Token grid B = 2, T = 4; ratio r = exp(logprobs - old_logprobs). clip_low 0.2, clip_high 0.3,
# so r is clipped to [0.8, 1.3].
#   row 0: (r 1.25, A +1) inside | (r 1.5, A +1) above | OBS (masked) | (r 0.5, A +1) below
#   row 1: (r 0.5, A -2) below   | (r 1.5, A -2) above | (r 0.9, A -2) inside | PAD (masked)
# Token loss max(-A r, -A clip(r)):
#   row 0: -1.25 | max(-1.5, -1.3) = -1.3 clipped | - | max(-0.5, -0.8) = -0.5 not clipped
#   row 1: max(1.0, 1.6) = 1.6 clipped | max(3.0, 2.6) = 3.0 not clipped | 1.8 | -
# token-mean = (-1.25 - 1.3 - 0.5 + 1.6 + 3.0 + 1.8) / 6 = 3.35 / 6; clipfrac = 2 / 6.
RATIOS = t([[1.25, 1.5, 3.0, 0.5], [0.5, 1.5, 0.9, 1.0]])
ADVANTAGES = t([[1, 1, 5, 1], [-2, -2, -2, 0]])
PPO_MASK = t([[1, 1, 0, 1], [1, 1, 1, 0]])
OLD_LOGPROBS = t([[-1.0, -2.0, -0.5, -3.0], [-1.5, -0.7, -2.2, -1.0]])


def policy_loss(clip_high: float | None, requires_grad: bool = False):
    logprobs = (OLD_LOGPROBS + torch.log(RATIOS)).requires_grad_(requires_grad)
    loss, metrics = ppo_policy_loss(logprobs, OLD_LOGPROBS, ADVANTAGES, PPO_MASK, 0.2, clip_high)
    return logprobs, loss, metrics


def test_ppo_policy_loss_with_asymmetric_clip():
    _, loss, metrics = policy_loss(clip_high=0.3)
    assert_close(loss, scalar(3.35 / 6))
    masked_ratios = [1.25, 1.5, 0.5, 0.5, 1.5, 0.9]
    k3 = sum((r - 1) - math.log(r) for r in masked_ratios) / 6
    assert metrics["losses/policy_loss"] == pytest.approx(3.35 / 6)
    assert metrics["losses/clipfrac"] == pytest.approx(2 / 6)
    assert metrics["losses/approx_kl"] == pytest.approx(k3)
    assert metrics["losses/ratio_mean"] == pytest.approx(6.15 / 6)


def test_ppo_policy_loss_symmetric_when_clip_high_is_none():
    # Clip range [0.8, 1.2]: row 0 token 0 (r 1.25, A +1) is now clipped to -1.2, token 1 gives
    # max(-1.5, -1.2) = -1.2, row 1 token 1 gives max(3.0, 2.4) = 3.0.
    # (-1.2 - 1.2 - 0.5 + 1.6 + 3.0 + 1.8) / 6 = 3.5 / 6; clipped tokens 3 of 6.
    _, loss, metrics = policy_loss(clip_high=None)
    assert_close(loss, scalar(3.5 / 6))
    assert metrics["losses/clipfrac"] == pytest.approx(0.5)


def test_ppo_gradient_is_zero_where_the_clip_binds_and_on_masked_tokens():
    # d loss / d logprob = -A * r / 6 where the unclipped term is taken, 0 where the clip binds:
    #   row 0: -1.25 / 6 | 0 (clipped) | 0 (OBS) | -0.5 / 6 (below the range but A > 0: not bound)
    #   row 1: 0 (clipped) | 3.0 / 6 (above the range but A < 0: not bound) | 1.8 / 6 | 0 (PAD)
    logprobs, loss, _ = policy_loss(clip_high=0.3, requires_grad=True)
    loss.backward()
    expected = t([[-1.25 / 6, 0, 0, -0.5 / 6], [0, 3.0 / 6, 1.8 / 6, 0]])
    assert_close(logprobs.grad, expected)


# agg_loss: row 0 has one token, row 1 three, row 2 none (left out of per-sequence means).
LOSS_MAT = t([[2, 50, 50, 50], [1, 2, 6, 50], [50, 50, 50, 50]])
AGG_MASK = t([[1, 0, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", (2 + 1 + 2 + 6) / 4),  # 11 / 4 = 2.75
        ("seq-mean-token-mean", (2 / 1 + 9 / 3) / 2),  # (2 + 3) / 2 = 2.5
        ("seq-mean-token-sum", (2 + 9) / 2),  # 5.5
    ],
)
def test_agg_loss_modes(mode, expected):
    assert_close(agg_loss(LOSS_MAT, AGG_MASK, mode), scalar(expected))


def test_agg_loss_rejects_unknown_mode():
    with pytest.raises(ValueError, match="'seq-sum'"):
        agg_loss(LOSS_MAT, AGG_MASK, "seq-sum")


# Value loss, clip 0.2; column 4 is masked junk.
#   a: V_old 1, V 1.5, R 2 -> V_clip 1.2: max(0.25, 0.64) = 0.64, clipped
#   b: V_old 1, V 1.5, R 1 -> V_clip 1.2: max(0.25, 0.04) = 0.25
#   c: V_old 0, V 0.1, R 1 -> inside the clip: 0.81
#   d: V_old 2, V 1,   R 0 -> V_clip 1.8: max(1, 3.24) = 3.24, clipped
# loss = 0.5 * (0.64 + 0.25 + 0.81 + 3.24) / 4 = 0.6175, clipfrac 2 / 4.
VALUES = t([[1.5, 1.5, 0.1, 1.0, 9.0]])
OLD_VALUES = t([[1.0, 1.0, 0.0, 2.0, -9.0]])
RETURNS = t([[2.0, 1.0, 1.0, 0.0, 3.0]])
VALUE_MASK = t([[1, 1, 1, 1, 0]])


def test_value_loss_clipped():
    values = VALUES.clone().requires_grad_(True)
    loss, metrics = value_loss(values, OLD_VALUES, RETURNS, VALUE_MASK, clip=0.2)
    assert_close(loss, scalar(0.6175))
    assert metrics["losses/value_loss"] == pytest.approx(0.6175)
    assert metrics["losses/value_clipfrac"] == pytest.approx(0.5)
    loss.backward()
    # Where the clipped error is taken the gradient is 0; elsewhere (V - R) / 4.
    assert_close(values.grad, t([[0.0, 0.5 / 4, -0.9 / 4, 0.0, 0.0]]))


def test_value_loss_unclipped():
    # 0.5 * (0.25 + 0.25 + 0.81 + 1.0) / 4 = 0.28875
    loss, metrics = value_loss(VALUES, OLD_VALUES, RETURNS, VALUE_MASK, clip=None)
    assert_close(loss, scalar(0.28875))
    assert metrics["losses/value_clipfrac"] == 0.0


LN2, LN3 = math.log(2), math.log(3)
LOGITS = t([[[0.0, LN3], [LN2, LN2]], [[LN3, 0.0], [0.0, 0.0]]])


def test_logprobs_from_logits():
    # softmax([0, ln 3]) = (1/4, 3/4); softmax([ln 2, ln 2]) = (1/2, 1/2); softmax([ln 3, 0]) =
    # (3/4, 1/4).
    labels = torch.tensor([[1, 0], [1, 1]])
    expected = t([[math.log(3 / 4), math.log(1 / 2)], [math.log(1 / 4), math.log(1 / 2)]])
    assert_close(logprobs_from_logits(LOGITS, labels), expected)
    # bf16 logits are scored in float32.
    out = logprobs_from_logits(LOGITS.to(torch.bfloat16), labels)
    assert out.dtype == torch.float32
    assert_close(out, expected.float(), atol=1e-2, rtol=0)


def test_logprobs_from_logits_matches_log_softmax_and_its_gradient():
    logits = torch.randn(3, 5, 11, generator=torch.Generator().manual_seed(0), requires_grad=True)
    labels = torch.randint(0, 11, (3, 5), generator=torch.Generator().manual_seed(1))
    ours = logprobs_from_logits(logits, labels)
    reference = torch.log_softmax(logits, dim=-1).gather(-1, labels[..., None]).squeeze(-1)
    assert_close(ours, reference)
    (grad_ours,) = torch.autograd.grad(ours.sum(), logits)
    (grad_reference,) = torch.autograd.grad(reference.sum(), logits)
    assert_close(grad_ours, grad_reference)


def test_entropy_from_logits():
    # H(1/4, 3/4) = 1/4 ln 4 + 3/4 ln(4/3); uniform over two tokens: ln 2.
    h = 0.25 * math.log(4) + 0.75 * math.log(4 / 3)
    assert_close(entropy_from_logits(LOGITS), t([[h, LN2], [h, LN2]]))


def test_row_chunks_bound_the_elements_a_chunk_holds_in_whole_rows():
    logits = torch.zeros(10, 7, 33)
    assert [len(c) for c in row_chunks(logits, 7 * 33 * 3)] == [3, 3, 3, 1]
    assert [len(c) for c in row_chunks(logits, 5)] == [1] * 10  # a row larger than the bound: alone
    assert [len(c) for c in row_chunks(logits)] == [10]
    assert [c.shape for c in row_chunks(torch.zeros(0, 7, 33))] == [(0, 7, 33)]


def test_chunked_scoring_equals_scoring_one_row_at_a_time():
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(9, 6, 50, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, 50, (9, 6), generator=generator)
    one_by_one = torch.stack(
        [torch.log_softmax(row, -1).gather(-1, lab[:, None])[:, 0] for row, lab in zip(logits, labels)]
    )
    entropies = torch.stack([-(torch.softmax(row, -1) * torch.log_softmax(row, -1)).sum(-1) for row in logits])
    assert torch.allclose(logprobs_from_logits(logits, labels), one_by_one, atol=1e-12)
    assert torch.allclose(entropy_from_logits(logits), entropies, atol=1e-12)
