"""Phase 3 of a step: rewards -> advantages, given the log-probs and values already in the batch."""

from __future__ import annotations

import torch

from roll.algorithms.advantages import compute_advantages
from roll.algorithms.gigpo import (
    anchor_group_stats,
    broadcast_to_tokens,
    compute_gigpo_advantages,
    compute_step_grpo_advantages,
    compute_step_reinforce_advantages,
)
from roll.algorithms.kl import apply_kl_penalty
from roll.algorithms.reward_norm import clip_symmetric, normalize_rewards
from roll.algorithms.utils import dense_codes, masked_mean, masked_whiten


def score_batch(batch, meta: dict, *, adv_estimator: str, gamma: float, lambd: float,
                kl_coef: float | None, whiten_advantages: bool, norm_adv_by_std: bool,
                kl_kind: str = "kl", advantage_clip: float | None = None) -> dict[str, float]:
    """Fill batch["advantages"] and batch["returns"] (B, T); return scoring metrics.

    With a reference model in the batch (`ref_logprobs`), the per-token KL penalty (estimator
    `kl_kind`, weight `kl_coef`; None: no penalty) is subtracted from the token rewards first
    (PPO-RLHF style), so every estimator sees the same rewards.
    For GRPO the trajectory score is the sum of its (penalised) token rewards. Advantages are
    whitened, then clamped to +-advantage_clip (None: not), as in ROLL.
    """
    mask = batch["response_mask"]
    token_rewards = batch["token_level_rewards"]
    metrics: dict[str, float] = {}
    if kl_coef is not None and "ref_logprobs" in batch.keys():
        token_rewards, kl_metrics = apply_kl_penalty(
            token_rewards, batch["old_logprobs"], batch["ref_logprobs"], mask, kl_coef, kl_kind)
        metrics.update(kl_metrics)
    scores = token_rewards.sum(dim=-1)
    adv, returns = compute_advantages(
        adv_estimator, token_rewards=token_rewards, scores=scores, group_ids=meta["traj_group_id"],
        values=batch["values"] if "values" in batch.keys() else None, response_mask=mask,
        gamma=gamma, lambd=lambd, norm_by_std=norm_adv_by_std)
    if whiten_advantages:
        adv = masked_whiten(adv, mask)
    adv, metrics = _clip_advantages(adv, mask, advantage_clip, metrics)
    batch["advantages"], batch["returns"] = adv, returns
    return metrics | _advantage_metrics(adv, returns, mask, scores)


def score_step_batch(batch, meta: dict, *, adv_estimator: str, step_reward_gamma: float,
                     episode_weight: float, step_weight: float, norm_adv_by_std: bool,
                     whiten_advantages: bool, advantage_clip: float | None = None) -> dict[str, float]:
    """Step-wise samples: one advantage per row (env step), broadcast to its generated tokens.

    "grpo" normalises each trajectory's score within its group (over trajectories, not rows);
    "gigpo" adds the anchor-state step advantage; "step_reinforce" uses discounted step returns.
    """
    mask = batch["response_mask"]
    if adv_estimator == "grpo":
        rows = compute_step_grpo_advantages(meta["episode_scores"], meta["traj_group_id"], meta["traj_id"],
                                            norm_std=norm_adv_by_std)
    elif adv_estimator == "gigpo":
        rows = compute_gigpo_advantages(
            meta["episode_scores"], meta["step_rewards"], meta["traj_group_id"], meta["traj_id"],
            meta["state_hash"], meta["step"], gamma=step_reward_gamma, episode_weight=episode_weight,
            step_weight=step_weight, norm_std=norm_adv_by_std)
    elif adv_estimator == "step_reinforce":
        rows = compute_step_reinforce_advantages(meta["step_rewards"], meta["traj_id"], meta["step"],
                                                 gamma=step_reward_gamma, normalize=not whiten_advantages)
    else:
        raise ValueError(f"adv_estimator {adv_estimator!r} does not apply to step-wise samples")
    adv = broadcast_to_tokens(rows, mask)
    if whiten_advantages:
        adv = masked_whiten(adv, mask)
    adv, metrics = _clip_advantages(adv, mask, advantage_clip, {})
    batch["advantages"], batch["returns"] = adv, adv
    anchors = anchor_group_stats(meta["traj_group_id"], meta["state_hash"])
    return metrics | _advantage_metrics(adv, adv, mask, meta["episode_scores"]) | {
        f"critic/anchor_{k}": v for k, v in anchors.items()}


def normalize_traj_rewards(batch, meta: dict, norm) -> None:
    """ROLL's `reward_normalization` on trajectory-wise rows, in place, before any estimator.

    Each row's episode score (the sum of its token rewards) is normalised (`normalize_rewards`,
    grouped by `norm.grouping`) and becomes the row's only reward, on its last generated token,
    as in ROLL: per-turn rewards collapse into the normalised outcome. `meta["scores"]` is kept raw
    for the metrics.
    """
    mask = batch["response_mask"]
    rewards = batch["token_level_rewards"]
    scores = normalize_rewards(rewards.sum(dim=-1), _group_keys(meta, norm.group_key, len(mask)),
                               norm_mean_type=norm.norm_mean_type, norm_std_type=norm.norm_std_type,
                               clip_range=norm.clip_range)
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, positions, -1).amax(dim=1)  # (B,) last generated token, -1: none
    new = torch.zeros_like(rewards)
    rows = torch.nonzero(last >= 0).squeeze(1)
    new[rows, last[rows]] = scores[rows].to(new.dtype)
    batch["token_level_rewards"] = new


def normalize_step_episode_scores(meta: dict, norm) -> None:
    """`reward_normalization` on step-wise rows, in place: the episode scores are normalised over
    trajectories (one score each, however many steps it has) and repeated on every step row."""
    trajs = dense_codes(meta["traj_id"])
    num = int(trajs.max()) + 1 if trajs.numel() else 0
    first = torch.full((num,), len(trajs), dtype=torch.long).scatter_reduce(
        0, trajs, torch.arange(len(trajs)), "amin")  # (N,) the first row of each trajectory
    keys = _group_keys(meta, norm.group_key, len(trajs))
    per_traj = normalize_rewards(meta["episode_scores"][first].float(), [keys[i] for i in first.tolist()],
                                 norm_mean_type=norm.norm_mean_type, norm_std_type=norm.norm_std_type,
                                 clip_range=norm.clip_range)
    meta["episode_scores"] = per_traj[trajs]


def clip_rewards(batch, meta: dict, limit: float, step_wise: bool) -> dict[str, float]:
    """ROLL's `reward_clip`, in place, after normalisation and before any estimator: the rewards the
    estimator reads are clamped to [-limit, limit] (trajectory-wise: every token reward; step-wise:
    the episode scores and the step rewards). "critic/reward_clip_frac": rows with a clamped value."""
    if step_wise:
        episode, step = meta["episode_scores"].float(), meta["step_rewards"].float()
        clamped_rows = (episode.abs() > limit) | (step.abs() > limit)
        meta["episode_scores"], _ = clip_symmetric(episode, limit)
        meta["step_rewards"], _ = clip_symmetric(step, limit)
    else:
        rewards = batch["token_level_rewards"]
        clamped_rows = ((rewards.abs() > limit) & (batch["response_mask"] > 0)).any(dim=-1)
        batch["token_level_rewards"], _ = clip_symmetric(rewards, limit)
    return {"critic/reward_clip_frac": float(clamped_rows.float().mean()) if clamped_rows.numel() else 0.0}


def _clip_advantages(adv, mask, limit: float | None, metrics: dict[str, float]):
    if limit is None:
        return adv, metrics
    adv, fraction = clip_symmetric(adv, limit, mask)
    return adv, {**metrics, "critic/advantage_clip_frac": fraction}


def _group_keys(meta: dict, grouping: str, size: int) -> list:
    return [0] * size if grouping == "batch" else list(meta[grouping])


def _advantage_metrics(adv, returns, mask, scores) -> dict[str, float]:
    return {
        "critic/score_mean": float(scores.float().mean()),
        "critic/advantages_mean": float(masked_mean(adv, mask)),
        "critic/advantages_abs_mean": float(masked_mean(adv.abs(), mask)),
        "critic/returns_mean": float(masked_mean(returns, mask)),
    }
