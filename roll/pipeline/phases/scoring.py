"""Phase 3 of a step: rewards -> advantages, given the log-probs and values already in the batch."""

from __future__ import annotations

from typing import TypeVar

import torch
from tensordict import TensorDict

from roll.algorithms.advantages import AdvantageOptions, compute_advantages
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
from roll.core.fields import Batch, RowInfo

_T = TypeVar("_T")


def score_batch(batch, rows: RowInfo, options: AdvantageOptions, *, kl_coef: float | None) -> dict[str, float]:
    """Fill batch["advantages"] and batch["returns"] (B, T); return scoring metrics.

    With a reference model in the batch (`ref_logprobs`), the per-token KL penalty (estimator
    `options.kl_kind`, weight `kl_coef`; None: no penalty) is subtracted from the token rewards first
    (PPO-RLHF style), so every estimator sees the same rewards; `whiten_rewards` (ROLL's key) then
    whitens them over the batch's generated tokens, unless there are fewer than two (as ROLL).
    For GRPO the trajectory score is the sum of its (penalised) token rewards. GAE bootstraps a
    truncated row from `rows.final_values` (the value of its last state), a terminated one from 0.
    Advantages are whitened, then clamped to +-advantage_clip (None: not), as in ROLL.
    """
    mask = batch[Batch.RESPONSE_MASK]
    token_rewards = batch[Batch.TOKEN_LEVEL_REWARDS]
    metrics: dict[str, float] = {}
    if kl_coef is not None and Batch.REF_LOGPROBS in batch.keys():
        token_rewards, kl_metrics = apply_kl_penalty(
            token_rewards, batch[Batch.OLD_LOGPROBS], batch[Batch.REF_LOGPROBS], mask, kl_coef, options.kl_kind
        )
        metrics.update(kl_metrics)
    if options.whiten_rewards and mask.sum() > 1:  # an unbiased variance needs two tokens
        token_rewards = masked_whiten(token_rewards, mask)
    scores = token_rewards.sum(dim=-1)
    bootstrap = None
    if rows.final_values is not None and rows.truncated is not None:
        bootstrap = rows.final_values * rows.truncated.to(rows.final_values.dtype)
    adv, returns = compute_advantages(
        options.estimator,
        token_rewards=token_rewards,
        scores=scores,
        group_ids=rows.traj_group_id,
        values=batch[Batch.VALUES] if Batch.VALUES in batch.keys() else None,
        response_mask=mask,
        gamma=options.gamma,
        lambd=options.lambd,
        norm_by_std=options.norm_by_std,
        bootstrap_values=bootstrap,
    )
    if options.whiten_advantages:
        adv = masked_whiten(adv, mask)
    adv, metrics = _clip_advantages(adv, mask, options.advantage_clip, metrics)
    batch[Batch.ADVANTAGES], batch[Batch.RETURNS] = adv, returns
    return metrics | _advantage_metrics(adv, returns, mask, scores)


def reward_kl_coef(controller_value: float, penalty_on: bool, add_token_level_kl: bool | None) -> float | None:
    """The weight of the KL penalty in the token rewards: None when no KL is measured; 0 when it is
    measured only (ROLL's `add_token_level_kl: false` with `init_kl_coef > 0`, which still feeds
    the controller); else the controller's value."""
    if not penalty_on:
        return None
    return 0.0 if add_token_level_kl is False else controller_value


def with_final_state(batch) -> TensorDict:
    """The critic's input with one more attended position per row, so that its values (B, T + 1)
    also hold V(whole row), the value of the state after the row's last token, at the row's
    length (`final_values`). values[:, t] = V(input_ids[:, :t]) reads only the tokens before t
    (causal), so the appended token is never read: its id does not matter (the padding there is
    kept), and the values at positions up to the row's length are those of `batch` itself.
    """
    ids, attention = batch[Batch.INPUT_IDS], batch[Batch.ATTENTION_MASK]
    rows, lengths = torch.arange(len(ids)), attention.sum(dim=1)
    ids = torch.cat([ids, ids[:, -1:]], dim=1)
    attention = torch.cat([attention, torch.zeros_like(attention[:, -1:])], dim=1)
    attention[rows, lengths] = 1
    return TensorDict({Batch.INPUT_IDS: ids, Batch.ATTENTION_MASK: attention}, batch_size=batch.batch_size)


def final_values(values: torch.Tensor, critic_attention_mask: torch.Tensor) -> torch.Tensor:
    """(B,) V(whole row) from the values (B, T + 1) of `with_final_state`'s output, whose attention
    mask is `critic_attention_mask`: at each row's appended position."""
    appended = critic_attention_mask.sum(dim=1) - 1
    return values[torch.arange(len(values)), appended]


def _step_field(value: _T | None, name: str) -> _T:
    """A field of `RowInfo` that only step-wise rows carry; a ValueError naming it if absent."""
    if value is None:
        raise ValueError(f"step-wise scoring needs RowInfo.{name}, which these rows lack (trajectory-wise?)")
    return value


def _step_row_advantages(rows: RowInfo, options: AdvantageOptions) -> torch.Tensor:
    """One advantage per row of a step-wise batch, by `options.estimator` (see `score_step_batch`)."""
    if options.estimator == "grpo":
        return compute_step_grpo_advantages(
            _step_field(rows.episode_scores, "episode_scores"),
            rows.traj_group_id,
            rows.traj_id,
            norm_std=options.norm_by_std,
            virtual_score=options.virtual_score,
        )
    if options.estimator == "gigpo":
        return compute_gigpo_advantages(
            _step_field(rows.episode_scores, "episode_scores"),
            _step_field(rows.step_rewards, "step_rewards"),
            rows.traj_group_id,
            rows.traj_id,
            _step_field(rows.state_hash, "state_hash"),
            _step_field(rows.step, "step"),
            gamma=options.step_reward_gamma,
            episode_weight=options.episode_weight,
            step_weight=options.step_weight,
            norm_std=options.norm_by_std,
            virtual_score=options.virtual_score,
        )
    if options.estimator == "step_reinforce":
        return _step_reinforce_advantages(rows, options)
    raise ValueError(f"adv_estimator {options.estimator!r} does not apply to step-wise samples")


def _step_reinforce_advantages(rows: RowInfo, options: AdvantageOptions) -> torch.Tensor:
    """Discounted step returns, normalised by `options.return_norm` over each group's rows."""
    norm = options.return_norm
    per_row = compute_step_reinforce_advantages(
        _step_field(rows.step_rewards, "step_rewards"),
        rows.traj_id,
        _step_field(rows.step, "step"),
        gamma=options.step_reward_gamma,
        normalize=not options.whiten_advantages and norm is None,
    )
    if norm is None:
        return per_row
    return normalize_rewards(
        per_row,
        rows.group_keys(norm.group_key),
        norm_mean_type=norm.norm_mean_type,
        norm_std_type=norm.norm_std_type,
        clip_range=norm.clip_range,
    )


def score_step_batch(batch, rows: RowInfo, options: AdvantageOptions) -> dict[str, float]:
    """Step-wise samples: one advantage per row (env step), broadcast to its generated tokens.

    "grpo" normalises each trajectory's score within its group (over trajectories, not rows);
    "gigpo" adds the anchor-state step advantage; "step_reinforce" uses discounted step returns,
    normalised as `options.return_norm` (a `reward_normalization`) says over the rows of each group, as ROLL
    does (its `agentic_reward_norm` of the step returns); without it, whitened over the batch unless
    `whiten_advantages` whitens the tokens instead.
    """
    mask = batch[Batch.RESPONSE_MASK]
    per_row = _step_row_advantages(rows, options)
    adv = broadcast_to_tokens(per_row, mask)
    if options.whiten_advantages:
        adv = masked_whiten(adv, mask)
    adv, metrics = _clip_advantages(adv, mask, options.advantage_clip, {})
    batch[Batch.ADVANTAGES], batch[Batch.RETURNS] = adv, adv
    anchors = anchor_group_stats(rows.traj_group_id, _step_field(rows.state_hash, "state_hash"))
    return (
        metrics
        | _advantage_metrics(adv, adv, mask, _step_field(rows.episode_scores, "episode_scores"))
        | {f"critic/anchor_{k}": v for k, v in anchors.items()}
    )


def normalize_traj_rewards(batch, rows: RowInfo, norm) -> None:
    """ROLL's `reward_normalization` on trajectory-wise rows, in place, before any estimator.

    Each row's episode score (the sum of its token rewards) is normalised (`normalize_rewards`,
    grouped by `norm.grouping`) and becomes the row's only reward, on its last generated token,
    as in ROLL: per-turn rewards collapse into the normalised outcome. `rows.scores` is kept raw
    for the metrics.
    """
    mask = batch[Batch.RESPONSE_MASK]
    rewards = batch[Batch.TOKEN_LEVEL_REWARDS]
    scores = normalize_rewards(
        rewards.sum(dim=-1),
        rows.group_keys(norm.group_key),
        norm_mean_type=norm.norm_mean_type,
        norm_std_type=norm.norm_std_type,
        clip_range=norm.clip_range,
    )
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, positions, -1).amax(dim=1)  # (B,) last generated token, -1: none
    new = torch.zeros_like(rewards)
    generated = torch.nonzero(last >= 0).squeeze(1)
    new[generated, last[generated]] = scores[generated].to(new.dtype)
    batch[Batch.TOKEN_LEVEL_REWARDS] = new


def normalize_step_episode_scores(rows: RowInfo, norm) -> None:
    """`reward_normalization` on step-wise rows, in place: the episode scores are normalised over
    trajectories (one score each, however many steps it has) and repeated on every step row."""
    trajs = dense_codes(rows.traj_id)
    num = int(trajs.max()) + 1 if trajs.numel() else 0
    first = torch.full((num,), len(trajs), dtype=torch.long).scatter_reduce(
        0, trajs, torch.arange(len(trajs)), "amin"
    )  # (N,) the first row of each trajectory
    keys = rows.group_keys(norm.group_key)
    per_traj = normalize_rewards(
        _step_field(rows.episode_scores, "episode_scores")[first].float(),
        [keys[i] for i in first.tolist()],
        norm_mean_type=norm.norm_mean_type,
        norm_std_type=norm.norm_std_type,
        clip_range=norm.clip_range,
    )
    rows.episode_scores = per_traj[trajs]


def clip_rewards(batch, rows: RowInfo, limit: float, step_wise: bool) -> dict[str, float]:
    """ROLL's `reward_clip`, in place, after normalisation and before any estimator: the rewards the
    estimator reads are clamped to [-limit, limit] (trajectory-wise: every token reward; step-wise:
    the episode scores and the step rewards). "critic/reward_clip_frac": rows with a clamped value."""
    if step_wise:
        episode, step = (
            _step_field(rows.episode_scores, "episode_scores").float(),
            _step_field(rows.step_rewards, "step_rewards").float(),
        )
        clamped_rows = (episode.abs() > limit) | (step.abs() > limit)
        rows.episode_scores, _ = clip_symmetric(episode, limit)
        rows.step_rewards, _ = clip_symmetric(step, limit)
    else:
        rewards = batch[Batch.TOKEN_LEVEL_REWARDS]
        clamped_rows = ((rewards.abs() > limit) & (batch[Batch.RESPONSE_MASK] > 0)).any(dim=-1)
        batch[Batch.TOKEN_LEVEL_REWARDS], _ = clip_symmetric(rewards, limit)
    return {"critic/reward_clip_frac": float(clamped_rows.float().mean()) if clamped_rows.numel() else 0.0}


def _clip_advantages(adv, mask, limit: float | None, metrics: dict[str, float]):
    if limit is None:
        return adv, metrics
    adv, fraction = clip_symmetric(adv, limit, mask)
    return adv, {**metrics, "critic/advantage_clip_frac": fraction}


def _advantage_metrics(adv, returns, mask, scores) -> dict[str, float]:
    return {
        "critic/score_mean": float(scores.float().mean()),
        "critic/advantages_mean": float(masked_mean(adv, mask)),
        "critic/advantages_abs_mean": float(masked_mean(adv.abs(), mask)),
        "critic/returns_mean": float(masked_mean(returns, mask)),
    }
