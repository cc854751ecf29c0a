"""Advantage estimators for multi-turn trajectories, chosen by name (`adv_estimator`).

All per-token tensors are (B, T) over the full token sequence of a sample: prompt, generated
tokens and environment observations interleaved. `response_mask` (B, T) is 1.0 exactly on tokens
the policy generated. Every output is 0 off the mask: observation and padding tokens get no
advantage and no return.

- `gae`: GAE (Schulman et al. 2016) at token level, as in RLHF PPO. One time step is one generated
  token; the recursion skips observation tokens (the env's transition). After a row's last
  generated token the next value is 0 if the trajectory terminated, and the value of its last
  state if it was truncated (`bootstrap_values`), as CleanRL and SB3 do: verl's multi-turn GAE
  plus the truncation bootstrap that verl leaves out.
- `grpo`: (score - group mean) / (group std + eps), unbiased std (Shao et al. 2024), broadcast to
  every generated token; `norm_by_std=False` is Dr. GRPO (Liu et al. 2025). A group of one gets 0.
- `reinforce`: baseline-free REINFORCE (Williams 1992): the discounted reward-to-go of each
  generated token.

Discounting is per generated token, not per turn: a turn of n tokens discounts the next turn's
rewards by gamma**n. In full: docs/algorithms.md#trajectory-estimators-in-full.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from roll.algorithms.kl import KLKind
from roll.algorithms.utils import (
    compress,
    dense_codes,
    reverse_discounted_cumsum,
    scatter,
)

GroupIds = Sequence[Hashable] | Tensor


def _check_rewards_on_generated_tokens(token_rewards: Tensor, response_mask: Tensor) -> None:
    """A reward on an observation or padding token would be dropped silently; refuse it instead."""
    if bool(((token_rewards != 0) & (response_mask == 0)).any()):
        raise ValueError(
            "token_rewards has non-zero entries off response_mask; place each step reward on the "
            "last generated token of its turn"
        )


@torch.no_grad()
def compute_gae(
    token_rewards: Tensor,
    values: Tensor,
    response_mask: Tensor,
    gamma: float,
    lambd: float,
    bootstrap_values: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Token-level GAE over the generated tokens of each row, skipping observation tokens.

    token_rewards (B, T): step rewards on the last generated token of each turn plus any
        per-token KL penalty; must be 0 off `response_mask`.
    values (B, T): critic values; entries off the mask are ignored.
    response_mask (B, T): 1.0 on generated tokens.
    bootstrap_values (B,): V_n, the value of the state after each row's last generated token:
        the critic's value of a truncated row's last state, 0 for a terminated row. None: all 0.
    Returns advantages (B, T) and returns = advantages + values, both 0 off the mask.

    On the packed generated tokens g_0..g_{n-1} of a row:
    delta_j = r_j + gamma * V_{j+1} - V_j (V_n = bootstrap), A_j = delta_j + gamma * lambd * A_{j+1}.
    """
    _check_rewards_on_generated_tokens(token_rewards, response_mask)
    rewards, valid, index = compress(token_rewards, response_mask)
    packed_values, _, _ = compress(values, response_mask)
    # compress zeroes slots past each row's last generated token, so V_n = 0 comes for free.
    next_values = torch.zeros_like(packed_values)
    next_values[:, :-1] = packed_values[:, 1:]
    if bootstrap_values is not None:
        lengths = valid.sum(dim=1).long()  # n per row; a row with no generated token has nothing to bootstrap
        rows = torch.nonzero(lengths > 0).squeeze(1)
        next_values[rows, lengths[rows] - 1] = bootstrap_values[rows].to(next_values.dtype)
    deltas = (rewards + gamma * next_values - packed_values) * valid
    advantages = reverse_discounted_cumsum(deltas, gamma * lambd)
    returns = (advantages + packed_values) * valid
    length = token_rewards.shape[1]
    return scatter(advantages, index, length), scatter(returns, index, length)


def group_index(group_ids: GroupIds, batch_size: int) -> Tensor:
    """Map any hashable group ids to dense ints 0..G-1 (B,), in order of first appearance."""
    if isinstance(group_ids, Tensor) and group_ids.shape != (batch_size,):
        shape = tuple(group_ids.shape)
        raise ValueError(f"group_ids must have shape ({batch_size},), got {shape}")
    if len(group_ids) != batch_size:
        raise ValueError(f"got {len(group_ids)} group_ids for {batch_size} scores")
    return dense_codes(group_ids)


@torch.no_grad()
def compute_grpo_advantages(
    scores: Tensor,
    group_ids: GroupIds,
    response_mask: Tensor,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """GRPO outcome advantages: each score against the other members of its group.

    scores (B,): one scalar per sample (e.g. the episode reward).
    group_ids (B,): any hashables or a LongTensor; equal ids form a group (same env seed).
    response_mask (B, T): 1.0 on generated tokens.
    Returns advantages (B, T) = A_i on every generated token, with
    A_i = (s_i - mean_g) / (std_g + eps) (unbiased std, as torch.std), or s_i - mean_g when
    `norm_by_std` is False; and returns (B, T) = s_i on every generated token. A group of one gets
    A = 0 (its std is undefined; its only baseline is itself).
    """
    group = group_index(group_ids, scores.shape[0]).to(scores.device)
    num_groups = int(group.max()) + 1 if group.numel() else 0
    counts = torch.bincount(group, minlength=num_groups).to(scores.dtype)
    means = scores.new_zeros(num_groups).index_add_(0, group, scores) / counts
    deviations = scores - means[group]
    if norm_by_std:
        sq_sums = scores.new_zeros(num_groups).index_add_(0, group, deviations * deviations)
        stds = torch.sqrt(sq_sums / (counts - 1).clamp_min(1))
        # A singleton's deviation is exactly 0, so it gets 0 / (0 + eps) = 0.
        deviations = deviations / (stds[group] + eps)
    mask = response_mask.to(scores.dtype)
    return deviations[:, None] * mask, scores[:, None] * mask


@torch.no_grad()
def compute_reinforce_returns(token_rewards: Tensor, response_mask: Tensor, gamma: float) -> tuple[Tensor, Tensor]:
    """Discounted reward-to-go over generated tokens; advantages are the returns (no baseline).

    token_rewards (B, T): as in `compute_gae`, 0 off the mask. response_mask (B, T).
    G_j = r_j + gamma * G_{j+1} over the packed generated tokens of a row, gamma applied once per
    generated token (observation tokens are skipped, not discounted). Returns (G, G), 0 off mask.
    """
    _check_rewards_on_generated_tokens(token_rewards, response_mask)
    rewards, _, index = compress(token_rewards, response_mask)
    returns = scatter(reverse_discounted_cumsum(rewards, gamma), index, token_rewards.shape[1])
    return returns, returns.clone()


@dataclass(frozen=True)
class AdvantageInputs:
    """Everything any estimator may read; each estimator takes what it needs."""

    response_mask: Tensor
    gamma: float
    lambd: float
    norm_by_std: bool
    token_rewards: Tensor | None = None
    scores: Tensor | None = None
    group_ids: GroupIds | None = None
    values: Tensor | None = None
    bootstrap_values: Tensor | None = None

    def need(self, estimator: str, name: str):
        """The input `name`, or a ValueError that says which estimator wanted it."""
        value = getattr(self, name)
        if value is None:
            raise ValueError(f"adv_estimator {estimator!r} needs {name}, which was not given")
        return value


def _gae(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    return compute_gae(
        inputs.need("gae", "token_rewards"),
        inputs.need("gae", "values"),
        inputs.response_mask,
        inputs.gamma,
        inputs.lambd,
        bootstrap_values=inputs.bootstrap_values,
    )


def _grpo(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    return compute_grpo_advantages(
        inputs.need("grpo", "scores"),
        inputs.need("grpo", "group_ids"),
        inputs.response_mask,
        norm_by_std=inputs.norm_by_std,
    )


def _reinforce(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    return compute_reinforce_returns(inputs.need("reinforce", "token_rewards"), inputs.response_mask, inputs.gamma)


ADV_ESTIMATORS: dict[str, Callable[[AdvantageInputs], tuple[Tensor, Tensor]]] = {
    "gae": _gae,
    "grpo": _grpo,
    "reinforce": _reinforce,
}


def compute_advantages(
    name: str,
    *,
    response_mask: Tensor,
    gamma: float,
    lambd: float,
    norm_by_std: bool = True,
    token_rewards: Tensor | None = None,
    scores: Tensor | None = None,
    group_ids: GroupIds | None = None,
    values: Tensor | None = None,
    bootstrap_values: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Run the estimator registered as `name`; returns (advantages, returns), each (B, T).

    The pipeline passes everything it has; an estimator missing an input it needs raises
    ValueError naming both. gae needs token_rewards and values, grpo scores and group_ids,
    reinforce token_rewards; gae also reads bootstrap_values (see `compute_gae`) when given.
    """
    if name not in ADV_ESTIMATORS:
        raise ValueError(f"unknown adv_estimator {name!r}; choose one of {sorted(ADV_ESTIMATORS)}")
    inputs = AdvantageInputs(
        response_mask=response_mask,
        gamma=gamma,
        lambd=lambd,
        norm_by_std=norm_by_std,
        token_rewards=token_rewards,
        scores=scores,
        group_ids=group_ids,
        values=values,
        bootstrap_values=bootstrap_values,
    )
    return ADV_ESTIMATORS[name](inputs)


@dataclass(frozen=True)
class AdvantageOptions:
    """How rewards become advantages, for a whole run (the config keys in brackets); built once at
    the edge (`roll.pipeline.setup.builders.build_advantage_options`) and read by the score phase."""

    estimator: str
    """The estimator (adv_estimator): `ADV_ESTIMATORS`, or step-wise grpo, gigpo, step_reinforce."""
    gamma: float = 1.0
    """Discount per generated token (gamma)."""
    lambd: float = 1.0
    """GAE's lambda (lambd)."""
    norm_by_std: bool = True
    """GRPO / GiGPO divide by the group's std (norm_adv_by_std_in_grpo); False: Dr. GRPO."""
    whiten_advantages: bool = False
    """Whiten the advantages over the batch's generated tokens (whiten_advantages)."""
    advantage_clip: float | None = None
    """Clamp the advantages to +-advantage_clip after whitening (advantage_clip); None: not."""
    whiten_rewards: bool = False
    """Trajectory-wise: whiten the token rewards before the estimator (whiten_rewards)."""
    kl_kind: KLKind = "kl"
    """Estimator of the KL penalty folded into the rewards (kl_penalty)."""
    step_reward_gamma: float = 1.0
    """Step-wise: discount per env step (step_reward_gamma)."""
    episode_weight: float = 1.0
    """GiGPO: weight of the episode advantage (episode_reward_weight)."""
    step_weight: float = 1.0
    """GiGPO: weight of the anchor-state step advantage (step_reward_weight)."""
    virtual_score: float | None = None
    """Step-wise GRPO / GiGPO: a virtual trajectory of this score in each group's episode
    statistics (virtual_max_score); None: none."""
    return_norm: Any = None
    """step_reinforce: the `reward_normalization` of its step returns (group_key, norm_mean_type,
    norm_std_type, clip_range); None: whitened over the batch."""
