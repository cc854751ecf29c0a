"""Phase 3 of a step: rewards -> advantages, given the log-probs and values already in the batch."""

from __future__ import annotations

from roll.algorithms.advantages import compute_advantages
from roll.algorithms.kl import apply_kl_penalty
from roll.algorithms.utils import masked_mean, masked_whiten


def score_batch(batch, meta: dict, *, adv_estimator: str, gamma: float, lambd: float,
                kl_coef: float, whiten_advantages: bool, norm_adv_by_std: bool) -> dict[str, float]:
    """Fill batch["advantages"] and batch["returns"] (B, T); return scoring metrics.

    With a reference model in the batch (`ref_logprobs`), the per-token KL penalty is subtracted
    from the token rewards first (PPO-RLHF style), so every estimator sees the same rewards.
    For GRPO the trajectory score is the sum of its (penalised) token rewards.
    """
    mask = batch["response_mask"]
    token_rewards = batch["token_level_rewards"]
    metrics: dict[str, float] = {}
    if "ref_logprobs" in batch.keys():
        token_rewards, kl_metrics = apply_kl_penalty(
            token_rewards, batch["old_logprobs"], batch["ref_logprobs"], mask, kl_coef)
        metrics.update(kl_metrics)
    scores = token_rewards.sum(dim=-1)
    adv, returns = compute_advantages(
        adv_estimator, token_rewards=token_rewards, scores=scores, group_ids=meta["traj_group_id"],
        values=batch["values"] if "values" in batch.keys() else None, response_mask=mask,
        gamma=gamma, lambd=lambd, norm_by_std=norm_adv_by_std)
    if whiten_advantages:
        adv = masked_whiten(adv, mask)
    batch["advantages"], batch["returns"] = adv, returns
    metrics.update({
        "critic/score_mean": float(scores.mean()),
        "critic/advantages_mean": float(masked_mean(adv, mask)),
        "critic/advantages_abs_mean": float(masked_mean(adv.abs(), mask)),
        "critic/returns_mean": float(masked_mean(returns, mask)),
    })
    return metrics
