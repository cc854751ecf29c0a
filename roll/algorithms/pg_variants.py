"""Policy-gradient losses chosen by ROLL's `actor_train.pg_variant`, over (B, T) token tensors.

Every variant maps per-token log-probs of the current weights (`logprobs`, with gradients), of the
weights that scored the batch (`old_logprobs`, pi_old) and advantages to per-token losses; the
shared `policy_gradient_loss` then applies the optional off-policy weights of `off_policy.py`,
aggregates with `loss_agg_mode` and adds the diagnostics every variant reports. With
r = exp(logprobs - old_logprobs) and sg() a stop-gradient:

- "vanilla": REINFORCE (Williams 1992, eq. 11): -A * log pi.
- "ppo": the clipped surrogate (Schulman et al. 2017, eq. 7), as `losses.ppo_policy_loss`.
- "tis": truncated IS of the REINFORCE gradient (Ionides 2008): -sg(clip(r, lo, hi)) * A * log pi.
- "topr": Tapered Off-Policy REINFORCE (Le Roux et al. 2025, eq. 8): -A log pi on rows that scored
  > 0, -sg(clip(r, 0, 1)) * A * log pi on the others, each side scaled by its weight.
- "cispo": MiniMax-M1 (2025, eq. 4): -sg(clip(r, 1-eps_low, 1+eps_high)) * A * log pi.
- "kimi15": Kimi k1.5 (2025, eq. 3): -A * log pi + tau/2 * (log pi - log pi_old)^2.

As in ROLL, TOPR's and Kimi's ratios are per token (the papers: whole responses). Unlike ROLL, TOPR
reads each row's own episode score, clip fractions are masked means over generated tokens, and
there is no PPO dual clip. In full: docs/algorithms.md#policy-gradient-variants-in-full.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from roll.algorithms.losses import AggMode, agg_loss
from roll.algorithms.utils import masked_mean


@dataclass(frozen=True)
class PGOptions:
    """Parameters of the variants, with ROLL's names and defaults (`actor_train.<name>`)."""

    clip_low: float = 0.2
    """ppo: the ratio is clipped below at 1 - clip_low."""
    clip_high: float = 0.2
    """ppo: the ratio is clipped above at 1 + clip_high."""
    tis_lower_bound: float = 0.0
    """tis: lower truncation of the ratio."""
    tis_upper_bound: float = 1.0
    """tis: upper truncation of the ratio."""
    topr_positive_weight: float = 1.0
    """topr: weight of rows whose trajectory scored > 0."""
    topr_negative_weight: float = 1.0
    """topr: weight of rows whose trajectory scored <= 0."""
    cispo_epsilon_low: float = 0.1
    """cispo: the IS weight is clipped below at 1 - cispo_epsilon_low."""
    cispo_epsilon_high: float = 0.1
    """cispo: the IS weight is clipped above at 1 + cispo_epsilon_high."""
    cispo_use_unified_mask: bool = False
    """cispo: drop the tokens outside PPO's trust region (MiniMax-M1 eq. 7)."""
    kimi15_tau: float = 0.1
    """kimi15: weight tau of the squared log-ratio penalty."""
    dual_clip: float | None = None
    """ppo: dual-clip bound c (ROLL's `dual_clip_loss`, c = 1 + 2 * pg_clip): where A < 0 the token
    loss is min(loss, -c * A); None: no dual clip."""


TokenLoss = tuple[Tensor, dict[str, float]]


def _frac(flags: Tensor, mask: Tensor) -> float:
    """Fraction of generated tokens where `flags` holds."""
    return float(masked_mean(flags.float(), mask.float()))


def vanilla_token_loss(logprobs, ratio, advantages, mask, opts, episode_scores) -> TokenLoss:
    """-A * log pi (REINFORCE)."""
    return -advantages * logprobs, {}


def ppo_token_loss(logprobs, ratio, advantages, mask, opts, episode_scores) -> TokenLoss:
    """max(-r A, -clip(r, 1 - clip_low, 1 + clip_high) A), PPO's pessimistic bound."""
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - opts.clip_low, 1.0 + opts.clip_high)
    low, high = ratio < 1.0 - opts.clip_low, ratio > 1.0 + opts.clip_high
    loss = torch.maximum(unclipped, clipped)
    metrics = {
        "losses/clipfrac": _frac(clipped > unclipped, mask),
        "actor/ppo_ratio_low_clipfrac": _frac(low, mask),
        "actor/ppo_ratio_high_clipfrac": _frac(high, mask),
        "actor/ppo_ratio_clipfrac": _frac(low | high, mask),
    }
    if opts.dual_clip is not None:  # ROLL: -max(-loss, c * A) where A < 0, i.e. min(loss, -c * A)
        bound = -opts.dual_clip * advantages
        capped = (advantages < 0) & (loss > bound)
        loss = torch.where(advantages < 0, torch.minimum(loss, bound), loss)
        metrics["actor/dual_clipfrac"] = _frac(capped, mask)
    return loss, metrics


def tis_token_loss(logprobs, ratio, advantages, mask, opts, episode_scores) -> TokenLoss:
    """-sg(clip(r, tis_lower_bound, tis_upper_bound)) * A * log pi."""
    weight = torch.clamp(ratio, opts.tis_lower_bound, opts.tis_upper_bound).detach()
    low, high = ratio < opts.tis_lower_bound, ratio > opts.tis_upper_bound
    return -weight * advantages * logprobs, {
        "actor/tis_lower_clipfrac": _frac(low, mask),
        "actor/tis_upper_clipfrac": _frac(high, mask),
        "actor/tis_total_clipfrac": _frac(low | high, mask),
        "actor/tis_clipped_ratio_mean": float(masked_mean(weight, mask)),
    }


def topr_token_loss(logprobs, ratio, advantages, mask, opts, episode_scores) -> TokenLoss:
    """Rows with episode score > 0: -w+ * A * log pi; the others: -w- * sg(clip(r, 0, 1)) * A * log pi."""
    if episode_scores is None:
        raise ValueError('pg_variant "topr" needs the episode score of every row')
    positive = (episode_scores > 0).unsqueeze(-1).expand_as(logprobs)
    truncated = torch.clamp(ratio, 0.0, 1.0).detach()
    loss = torch.where(
        positive,
        opts.topr_positive_weight * -advantages * logprobs,
        opts.topr_negative_weight * -truncated * advantages * logprobs,
    )
    return loss, {
        "actor/topr_positive_ratio": float((episode_scores > 0).float().mean()),
        "actor/topr_negative_ratio": float((episode_scores <= 0).float().mean()),
        "actor/topr_negative_total_clipfrac": _frac(~positive & (ratio > 1.0), mask),
    }


def cispo_token_loss(logprobs, ratio, advantages, mask, opts, episode_scores) -> TokenLoss:
    """-sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * log pi, optionally masked as in eq. 7."""
    lower, upper = 1.0 - opts.cispo_epsilon_low, 1.0 + opts.cispo_epsilon_high
    weight = torch.clamp(ratio, lower, upper).detach()
    loss = -weight * advantages * logprobs
    low, high = ratio < lower, ratio > upper
    metrics = {
        "actor/cispo_lower_clipfrac": _frac(low, mask),
        "actor/cispo_upper_clipfrac": _frac(high, mask),
        "actor/cispo_total_clipfrac": _frac(low | high, mask),
        "actor/cispo_clipped_ratio_mean": float(masked_mean(weight, mask)),
    }
    if opts.cispo_use_unified_mask:
        dropped = ((advantages > 0) & high) | ((advantages < 0) & low)
        loss = torch.where(dropped, torch.zeros_like(loss), loss)
        metrics["actor/cispo_kept_tokens"] = _frac(~dropped, mask)
    return loss, metrics


def kimi15_token_loss(logprobs, ratio, advantages, mask, opts, episode_scores) -> TokenLoss:
    """-A * log pi + tau / 2 * (log pi - log pi_old)^2."""
    log_ratio = torch.log(ratio)
    penalty = 0.5 * opts.kimi15_tau * log_ratio.square()
    return -advantages * logprobs + penalty, {
        "actor/kimi15_log_ratio_abs_mean": float(masked_mean(log_ratio.abs().detach(), mask)),
        "actor/kimi15_kl_reg": float(masked_mean(penalty.detach(), mask)),
    }


PG_VARIANTS: dict[str, Callable[..., TokenLoss]] = {
    "vanilla": vanilla_token_loss,
    "ppo": ppo_token_loss,
    "tis": tis_token_loss,
    "topr": topr_token_loss,
    "cispo": cispo_token_loss,
    "kimi15": kimi15_token_loss,
}


def policy_gradient_loss(
    variant: str,
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    options: PGOptions = PGOptions(),
    loss_agg_mode: AggMode = "token-mean",
    weights: Tensor | None = None,
    episode_scores: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The `variant`'s per-token loss, times `weights` (detached, off-policy correction) when
    given, aggregated over `response_mask` by `loss_agg_mode`.

    logprobs, old_logprobs, advantages, response_mask, weights: (B, T); episode_scores (B,) (the
    row's trajectory score, needed by "topr"). Gradients flow through `logprobs` only.
    Metrics: "losses/policy_loss"; "losses/approx_kl", the k3 estimate mean((r - 1) - log r) of
    KL(old || new); "losses/ratio_mean"; and the variant's own (ROLL's names, see above).
    """
    if variant not in PG_VARIANTS:
        raise ValueError(f"unknown pg_variant {variant!r}; choose one of {sorted(PG_VARIANTS)}")
    log_ratio = logprobs - old_logprobs.detach()
    ratio = torch.exp(log_ratio)
    token_loss, metrics = PG_VARIANTS[variant](
        logprobs, ratio, advantages.detach(), response_mask, options, episode_scores
    )
    if weights is not None:
        token_loss = token_loss * weights.detach()
    loss = agg_loss(token_loss, response_mask, loss_agg_mode)
    with torch.no_grad():
        metrics = {
            "losses/policy_loss": loss.item(),
            "losses/approx_kl": masked_mean((ratio - 1.0) - log_ratio, response_mask).item(),
            "losses/ratio_mean": masked_mean(ratio, response_mask).item(),
            **metrics,
        }
    return loss, metrics
