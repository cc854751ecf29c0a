"""KL penalty estimators and controllers against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from roll.algorithms.kl import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_loss,
    kl_penalty,
    make_kl_controller,
)

F64 = torch.float64


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=F64)


# log pi - log pi_ref = 0.5, 0, -1 on three tokens.
LOGPROBS = t([[-1.0, -2.0, -2.0]])
REF_LOGPROBS = t([[-1.5, -2.0, -1.0]])


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("kl", [0.5, 0.0, -1.0]),
        ("abs", [0.5, 0.0, 1.0]),
        ("mse", [0.125, 0.0, 0.5]),  # 0.5 * diff^2
        # exp(ref - lp) - (ref - lp) - 1: ref - lp = -0.5, 0, 1
        ("k3", [math.exp(-0.5) + 0.5 - 1, 0.0, math.e - 2]),
        ("low_var_kl", [math.exp(-0.5) + 0.5 - 1, 0.0, math.e - 2]),  # k3, far from the clamp
    ],
)
def test_kl_penalty_kinds(kind, expected):
    assert_close(kl_penalty(LOGPROBS, REF_LOGPROBS, kind), t([expected]))


def test_k3_is_never_negative_and_zero_only_when_equal():
    generator = torch.Generator().manual_seed(0)
    logprobs = -torch.rand(4, 50, generator=generator, dtype=F64) * 5
    ref_logprobs = -torch.rand(4, 50, generator=generator, dtype=F64) * 5
    assert bool((kl_penalty(logprobs, ref_logprobs, "k3") > 0).all())
    assert_close(kl_penalty(logprobs, logprobs, "k3"), torch.zeros(4, 50, dtype=F64))


def test_kl_penalty_rejects_unknown_kind():
    with pytest.raises(ValueError, match="'low_var'"):
        kl_penalty(LOGPROBS, REF_LOGPROBS, "low_var")


def test_apply_kl_penalty_only_on_generated_tokens():
    # kl = 0.5, -1, (OBS: 7, ignored), 0.25; coef 0.1.
    # rewards 0, 1, 0, 2 -> 0 - 0.05, 1 + 0.1, 0, 2 - 0.025; mean kl = (0.5 - 1 + 0.25) / 3.
    rewards = t([[0.0, 1.0, 0.0, 2.0]])
    logprobs = t([[-1.0, -2.0, 0.0, -0.75]])
    ref_logprobs = t([[-1.5, -1.0, -7.0, -1.0]])
    mask = t([[1, 1, 0, 1]])
    new_rewards, metrics = apply_kl_penalty(rewards, logprobs, ref_logprobs, mask, kl_coef=0.1)
    assert_close(new_rewards, t([[-0.05, 1.1, 0.0, 1.975]]))
    assert metrics["critic/kl"] == pytest.approx(-0.25 / 3)
    assert metrics["critic/kl_coef"] == 0.1


def test_adaptive_kl_controller_updates():
    controller = AdaptiveKLController(init_kl_coef=0.2, target_kl=6.0, horizon=10_000)
    # 9 / 6 - 1 = 0.5, clipped to 0.2: 0.2 * (1 + 0.2 * 256 / 10000) = 0.2 * 1.00512 = 0.201024
    controller.update(current_kl=9.0, n_steps=256)
    assert controller.value == pytest.approx(0.201024)
    # 5.4 / 6 - 1 = -0.1: 0.201024 * (1 - 0.1 * 500 / 10000) = 0.201024 * 0.995 = 0.20001888
    controller.update(current_kl=5.4, n_steps=500)
    assert controller.value == pytest.approx(0.20001888)
    # A checkpoint restores the adapted coefficient, not the initial one.
    restored = AdaptiveKLController(init_kl_coef=0.2, target_kl=6.0, horizon=10_000)
    restored.load_state_dict(controller.state_dict())
    assert restored.value == pytest.approx(0.20001888)


def test_fixed_kl_controller_never_moves():
    controller = FixedKLController(0.05)
    controller.update(current_kl=100.0, n_steps=1000)
    assert controller.value == 0.05
    restored = FixedKLController(0.0)
    restored.load_state_dict(controller.state_dict())
    assert restored.value == 0.05


def test_make_kl_controller_picks_adaptive_only_with_a_target():
    assert isinstance(make_kl_controller(0.1, None), FixedKLController)
    adaptive = make_kl_controller(0.1, 6.0, horizon=500)
    assert isinstance(adaptive, AdaptiveKLController)
    assert (adaptive.target_kl, adaptive.horizon) == (6.0, 500)
    with pytest.raises(ValueError, match="target_kl > 0"):
        make_kl_controller(0.1, 0.0)


def test_low_var_kl_is_k3_clamped_at_10():
    # log pi - log pi_ref = -12: k3 = exp(12) - 12 - 1 = 162741.79..., low_var_kl = 10.
    logprobs, ref_logprobs = t([[-13.0]]), t([[-1.0]])
    assert kl_penalty(logprobs, ref_logprobs, "k3").item() == pytest.approx(math.exp(12) - 13)
    assert kl_penalty(logprobs, ref_logprobs, "low_var_kl").item() == 10.0


# The KL loss: diff = log pi - log pi_ref = 0.5, 0, -1 on generated tokens, and -9 on a masked one
# (it must not count); token-mean over the 3 generated tokens, gradient d loss / d log pi.
KL_LOGPROBS = t([[-1.0, -2.0, -2.0, -9.0]])
KL_REF = t([[-1.5, -2.0, -1.0, 0.0]])
KL_MASK = t([[1, 1, 1, 0]])
E_HALF = math.exp(-0.5)


@pytest.mark.parametrize(
    ("kind", "loss", "grad"),
    [
        # k1: (0.5 + 0 - 1) / 3; d/d lp = 1 / 3 per token
        ("kl", -0.5 / 3, [1 / 3, 1 / 3, 1 / 3]),
        # |k1|: 1.5 / 3; sign(diff) / 3 (torch's sign(0) = 0)
        ("abs", 0.5, [1 / 3, 0.0, -1 / 3]),
        # k2 = diff^2 / 2: (0.125 + 0 + 0.5) / 3; diff / 3
        ("mse", 0.625 / 3, [0.5 / 3, 0.0, -1 / 3]),
        # k3 = exp(-diff) + diff - 1: (e^-0.5 - 0.5 + 0 + e - 2) / 3; (1 - exp(-diff)) / 3
        ("k3", (E_HALF - 0.5 + math.e - 2) / 3, [(1 - E_HALF) / 3, 0.0, (1 - math.e) / 3]),
        ("low_var_kl", (E_HALF - 0.5 + math.e - 2) / 3, [(1 - E_HALF) / 3, 0.0, (1 - math.e) / 3]),
    ],
)
def test_kl_loss_per_estimator(kind, loss, grad):
    logprobs = KL_LOGPROBS.clone().requires_grad_(True)
    value, metrics = kl_loss(logprobs, KL_REF, KL_MASK, kind, "token-mean")
    assert value.item() == pytest.approx(loss)
    assert metrics == {"losses/kl_loss": pytest.approx(loss)}
    value.backward()
    assert_close(logprobs.grad, t([[*grad, 0.0]]))
