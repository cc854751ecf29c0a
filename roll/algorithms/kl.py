"""KL penalty against a frozen reference policy, and the controllers that set its coefficient.

The penalty is folded into the per-token reward (Ziegler et al. 2019; Ouyang et al. 2022):
r_t <- r_t - beta * kl_t on generated tokens, before advantages are computed. Estimators of the
per-token KL(pi || pi_ref) from samples of pi (Schulman, "Approximating KL divergence", 2020):
"kl" (k1) = log pi - log pi_ref; "abs" = |k1|; "mse" (k2) = 0.5 * k1^2;
"k3" = exp(-k1) + k1 - 1, unbiased and never negative, unclamped; "low_var_kl" = k3 clamped to
[-10, 10], verl's name for what ROLL's actor uses as its KL loss (ROLL's `compute_approx_kl`
"k3" clamps there too).

`kl_loss` is the other way to hold the policy near the reference: a term kl_loss_coef * KL added
to the actor's loss (GRPO, Shao et al. 2024, eq. 3, with k3), whose gradient flows through log pi,
instead of a penalty folded into the rewards.

`AdaptiveKLController` is Ziegler et al. (2019) as implemented in TRL and verl. It differs from
TRL in what `current_kl` means: `apply_kl_penalty` reports the mean KL per generated token
(verl's scale), whereas TRL fed the KL summed over a sequence, so a TRL `target_kl` of 6 nats is
far larger than a per-token target here.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from roll.algorithms.losses import AggMode, agg_loss
from roll.algorithms.utils import masked_mean

KLKind = Literal["kl", "abs", "mse", "k3", "low_var_kl"]
KL_KINDS: tuple[str, ...] = ("kl", "abs", "mse", "k3", "low_var_kl")


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: KLKind) -> Tensor:
    """Per-token KL estimate (B, T) from log-probs (B, T) of the sampled tokens under both models.

    Positions off the response mask hold meaningless numbers; callers mask them.
    """
    diff = logprobs - ref_logprobs
    if kind == "kl":
        return diff
    if kind == "abs":
        return diff.abs()
    if kind == "mse":
        return 0.5 * diff * diff
    if kind == "k3":
        return torch.exp(-diff) + diff - 1.0
    if kind == "low_var_kl":
        return torch.clamp(torch.exp(-diff) + diff - 1.0, min=-10.0, max=10.0)
    raise ValueError(f"unknown kl penalty kind {kind!r}; choose one of {', '.join(KL_KINDS)}")


def kl_loss(
    logprobs: Tensor, ref_logprobs: Tensor, response_mask: Tensor, kind: KLKind, loss_agg_mode: AggMode
) -> tuple[Tensor, dict[str, float]]:
    """KL(pi || pi_ref) estimated per generated token by `kind`, aggregated like the policy loss.

    logprobs (B, T) carries gradients; ref_logprobs (B, T) is a constant. The caller adds
    kl_loss_coef times the result to the actor loss. Metric: "losses/kl_loss", the aggregated KL.
    """
    loss = agg_loss(kl_penalty(logprobs, ref_logprobs.detach(), kind), response_mask, loss_agg_mode)
    return loss, {"losses/kl_loss": loss.item()}


@torch.no_grad()
def apply_kl_penalty(
    token_rewards: Tensor,
    logprobs: Tensor,
    ref_logprobs: Tensor,
    response_mask: Tensor,
    kl_coef: float,
    kind: KLKind = "kl",
) -> tuple[Tensor, dict[str, float]]:
    """token_rewards - kl_coef * kl on generated tokens; other positions are returned unchanged.

    All inputs (B, T). Metrics: "critic/kl", the mean KL per generated token (feed it to the
    KL controller's `update`), and "critic/kl_coef", the coefficient used.
    """
    kl = kl_penalty(logprobs, ref_logprobs, kind) * response_mask
    metrics = {"critic/kl": masked_mean(kl, response_mask).item(), "critic/kl_coef": float(kl_coef)}
    return token_rewards - kl_coef * kl, metrics


class FixedKLController:
    """A constant KL coefficient; `update` does nothing (used when no target KL is set)."""

    def __init__(self, kl_coef: float):
        if kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing to adapt; the signature matches `AdaptiveKLController.update`."""

    def state_dict(self) -> dict[str, float]:
        return {"kl_coef": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["kl_coef"])


class AdaptiveKLController:
    """Moves the KL coefficient so that the observed KL tracks `target_kl` (Ziegler et al. 2019).

    Per update: e = clip(current_kl / target_kl - 1, -0.2, 0.2); value *= 1 + e * n_steps / horizon.
    `n_steps` is the number of samples the KL was measured on; `horizon` sets how many samples it
    takes to move the coefficient appreciably (TRL and verl default to 10000).
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        if init_kl_coef < 0 or target_kl <= 0 or horizon <= 0:
            raise ValueError(
                f"need init_kl_coef >= 0, target_kl > 0 and horizon > 0, got {init_kl_coef}, {target_kl}, {horizon}"
            )
        self.value = float(init_kl_coef)
        self.target_kl = float(target_kl)
        self.horizon = int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        proportional_error = min(max(current_kl / self.target_kl - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"kl_coef": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["kl_coef"])


def make_kl_controller(
    init_kl_coef: float, target_kl: float | None, horizon: int = 10_000
) -> FixedKLController | AdaptiveKLController:
    """Adaptive controller when `target_kl` is set, else a fixed coefficient `init_kl_coef`."""
    if target_kl is None:
        return FixedKLController(init_kl_coef)
    return AdaptiveKLController(init_kl_coef, target_kl, horizon)
