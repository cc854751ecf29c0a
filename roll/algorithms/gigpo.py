"""Step-wise advantage estimators: one sample (row) per environment step, one advantage per row.

A step-wise batch has S rows; every argument is a length-S list or 1-D tensor, rows in any order:
`traj_group_ids` (the trajectories that started from one env seed), `traj_ids` (unique across the
batch), `steps` (0-based index in the trajectory), `state_hashes` (the observation the row
answered), `step_rewards` (r_t) and `episode_scores` (R(tau), repeated on each of its rows). Each
estimator returns advantages (S,); `broadcast_to_tokens` puts them on each row's generated tokens,
(S, T). Every trajectory must be complete (steps 0..L-1, each once), else ValueError.

- `gigpo`: GiGPO (Feng et al. 2025): episode_weight * A_E + step_weight * A_S. A_E normalises
  R(tau) over the group's trajectories, each counted once (the paper's Eq. 3; verl-agent and ROLL
  count step rows, which weighs a trajectory by its length). A_S normalises the step return R_t,
  discounted once per env step, over the anchor group: the group's rows whose observation hashes
  are equal (the paper: equal env states).
- `step_reinforce`: REINFORCE (Williams 1992) on env steps: A = R_t, optionally whitened.
- `step_grpo`: GRPO (Shao et al. 2024) on step rows: `gigpo` with step_weight 0 and norm_std.

A group with one member, or whose values are all equal, gets exactly 0 (verl-agent: the raw
return). `virtual_score` (NGRPO, Nan et al. 2025, "advantage calibration") adds one virtual
trajectory of that score (the task's best) to each group's episode statistics, so a group whose
trajectories all scored less, e.g. all failed alike, gets negative A_E instead of 0. The math
and every difference from the papers, verl-agent and ROLL: docs/algorithms.md#gigpo-in-full.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

from roll.algorithms.utils import dense_codes, reverse_discounted_cumsum

Ids = Sequence[Hashable] | Tensor
Numbers = Sequence[float] | Tensor


def _floats(values: Numbers, name: str) -> Tensor:
    """A floating tensor (S,); integer input becomes the default float dtype."""
    tensor = values if isinstance(values, Tensor) else torch.tensor(values)
    if tensor.dim() != 1:
        raise ValueError(f"{name} must be 1-D (one entry per row), got {tuple(tensor.shape)}")
    return tensor if tensor.is_floating_point() else tensor.to(torch.get_default_dtype())


def _codes(ids: Ids, size: int, name: str, device: torch.device) -> Tensor:
    """Map any hashable ids to dense ints 0..G-1 (S,), so that groups become scatter indices."""
    if isinstance(ids, Tensor) and ids.shape != (size,):
        raise ValueError(f"{name} must have shape ({size},), got {tuple(ids.shape)}")
    if len(ids) != size:
        raise ValueError(f"{name} has {len(ids)} entries for {size} step rows")
    return dense_codes(ids).to(device)


def _pair_codes(outer: Tensor, inner: Tensor) -> Tensor:
    """Dense codes (S,) of the pairs (outer[i], inner[i]), e.g. (group, state) for anchors."""
    if outer.numel() == 0:
        return outer
    return torch.unique(outer * (int(inner.max()) + 1) + inner, return_inverse=True)[1]


def _steps(steps: Sequence[int] | Tensor, size: int, device: torch.device) -> Tensor:
    tensor = steps if isinstance(steps, Tensor) else torch.tensor(steps, dtype=torch.long)
    if tensor.shape != (size,) or tensor.is_floating_point():
        raise ValueError(f"steps must be {size} integers, got {tensor.dtype} {tuple(tensor.shape)}")
    return tensor.to(device=device, dtype=torch.long)


def _num_groups(codes: Tensor) -> int:
    return int(codes.max()) + 1 if codes.numel() else 0


def _extremes(values: Tensor, groups: Tensor) -> tuple[Tensor, Tensor]:
    """The largest and the smallest value (G,) of each group; values, groups (N,)."""
    empty = values.new_zeros(_num_groups(groups))
    return (
        empty.scatter_reduce(0, groups, values, "amax", include_self=False),
        empty.scatter_reduce(0, groups, values, "amin", include_self=False),
    )


def _centre_in_groups(values: Tensor, groups: Tensor, norm_std: bool, eps: float) -> Tensor:
    """(x - mean_g) / F_g for every entry; F_g = std_g + eps (unbiased std) or 1.

    values (N,), groups (N,) dense codes. A group without spread (one member, or all values
    equal) gets exactly 0: its deviations are 0 only up to rounding (mean of 0.1, 0.1, 0.1), and
    rounding noise divided by a std of the same size would be an advantage of order 1.
    """
    num_groups = _num_groups(groups)
    counts = torch.bincount(groups, minlength=num_groups).to(values.dtype)
    means = values.new_zeros(num_groups).index_add_(0, groups, values) / counts.clamp_min(1)
    deviations = values - means[groups]
    if norm_std:
        sq_sums = values.new_zeros(num_groups).index_add_(0, groups, deviations * deviations)
        stds = torch.sqrt(sq_sums / (counts - 1).clamp_min(1))
        deviations = deviations / (stds[groups] + eps)
    highest, lowest = _extremes(values, groups)
    no_spread = (highest == lowest)[groups]
    return torch.where(no_spread, torch.zeros_like(deviations), deviations)


def _per_trajectory(values: Tensor, trajs: Tensor, what: str) -> Tensor:
    """The one value (N,) each trajectory repeats on all its rows; ValueError if rows disagree."""
    highest, lowest = _extremes(values, trajs)
    if bool((highest != lowest).any()):
        raise ValueError(f"the rows of one traj_id must share one {what}")
    return highest


def _episode_advantages(
    scores: Tensor, groups: Tensor, trajs: Tensor, norm_std: bool, eps: float, virtual_score: float | None = None
) -> Tensor:
    """A_E per row (S,): each trajectory's score centred over the trajectories of its group.

    Statistics are taken on one entry per trajectory, then read back onto its rows, so a long
    trajectory counts once like a short one. With `virtual_score`, each group's mean and std also
    count one virtual trajectory of that score, which gets no advantage itself (NGRPO's advantage
    calibration).
    """
    traj_scores = _per_trajectory(scores, trajs, "episode score")
    traj_groups = _per_trajectory(groups, trajs, "traj_group_id")
    if virtual_score is None:
        return _centre_in_groups(traj_scores, traj_groups, norm_std, eps)[trajs]
    num_trajs, num_groups = traj_scores.shape[0], _num_groups(traj_groups)
    virtual = traj_scores.new_full((num_groups,), virtual_score)
    codes = torch.arange(num_groups, device=traj_groups.device)
    centred = _centre_in_groups(torch.cat([traj_scores, virtual]), torch.cat([traj_groups, codes]), norm_std, eps)
    return centred[:num_trajs][trajs]


def _check_complete(trajs: Tensor, steps: Tensor) -> None:
    """Each trajectory's steps must be 0..L-1 exactly once: distinct (traj, step) pairs, none
    negative, and the largest equal to the row count - 1 leave no room for a gap."""
    if steps.numel() == 0:
        return
    lengths = torch.bincount(trajs)
    last, _ = _extremes(steps, trajs)
    if (
        int(steps.min()) < 0
        or _num_groups(_pair_codes(trajs, steps)) != steps.numel()
        or bool((last != lengths - 1).any())
    ):
        raise ValueError("each trajectory must have all its rows in the batch, with steps 0..L-1 each once")


def _step_returns(rewards: Tensor, trajs: Tensor, steps: Tensor, gamma: float) -> Tensor:
    """R_t = sum_{k>=t} gamma^(k-t) r_k within each trajectory, per row (S,).

    Rows are placed in a (N, L) table at (trajectory, step), zero past each trajectory's end; the
    reverse recursion runs over the L columns and the table is read back at the same places.
    """
    _check_complete(trajs, steps)
    length = int(steps.max()) + 1 if steps.numel() else 0
    table = rewards.new_zeros(_num_groups(trajs), length).index_put_((trajs, steps), rewards)
    return reverse_discounted_cumsum(table, gamma)[trajs, steps]


@torch.no_grad()
def compute_gigpo_advantages(
    episode_scores: Numbers,
    step_rewards: Numbers,
    traj_group_ids: Ids,
    traj_ids: Ids,
    state_hashes: Ids,
    steps: Sequence[int] | Tensor,
    *,
    gamma: float,
    episode_weight: float = 1.0,
    step_weight: float = 1.0,
    norm_std: bool = False,
    virtual_score: float | None = None,
    eps: float = 1e-6,
) -> Tensor:
    """GiGPO advantages (S,): episode_weight * A_E + step_weight * A_S (see the module docstring).

    episode_scores (S,): R(tau) of the row's trajectory. step_rewards (S,): r_t of the row.
    traj_group_ids, traj_ids, state_hashes (S,): hashables or a tensor. steps (S,): ints.
    gamma discounts once per env step. The dtype is that of the scores and rewards promoted.
    virtual_score: A_E's groups count one virtual trajectory of this score (the module docstring).
    """
    scores = _floats(episode_scores, "episode_scores")
    size, device = scores.shape[0], scores.device
    rewards = _floats(step_rewards, "step_rewards")
    if rewards.shape != (size,):
        raise ValueError(f"step_rewards has {rewards.shape[0]} entries for {size} step rows")
    dtype = torch.promote_types(scores.dtype, rewards.dtype)
    scores, rewards = scores.to(dtype), rewards.to(dtype=dtype, device=device)
    groups = _codes(traj_group_ids, size, "traj_group_ids", device)
    trajs = _codes(traj_ids, size, "traj_ids", device)
    anchors = _pair_codes(groups, _codes(state_hashes, size, "state_hashes", device))
    episode = _episode_advantages(scores, groups, trajs, norm_std, eps, virtual_score)
    returns = _step_returns(rewards, trajs, _steps(steps, size, device), gamma)
    step = _centre_in_groups(returns, anchors, norm_std, eps)
    return episode_weight * episode + step_weight * step


@torch.no_grad()
def compute_step_reinforce_advantages(
    step_rewards: Numbers,
    traj_ids: Ids,
    steps: Sequence[int] | Tensor,
    *,
    gamma: float,
    normalize: bool = True,
    eps: float = 1e-6,
) -> Tensor:
    """Discounted step returns R_t (S,) as advantages, with no baseline.

    With `normalize`, whitened over all rows of the batch: (R_t - mean) / (std + eps), unbiased
    std over rows (so a long trajectory weighs by its length, as each row is one sample). A batch
    of one row or of equal returns gets 0. Without it, the raw returns.
    """
    rewards = _floats(step_rewards, "step_rewards")
    size, device = rewards.shape[0], rewards.device
    trajs = _codes(traj_ids, size, "traj_ids", device)
    returns = _step_returns(rewards, trajs, _steps(steps, size, device), gamma)
    if not normalize:
        return returns
    whole_batch = torch.zeros_like(trajs)
    return _centre_in_groups(returns, whole_batch, norm_std=True, eps=eps)


@torch.no_grad()
def compute_step_grpo_advantages(
    episode_scores: Numbers,
    traj_group_ids: Ids,
    traj_ids: Ids,
    *,
    norm_std: bool = True,
    virtual_score: float | None = None,
    eps: float = 1e-6,
) -> Tensor:
    """Trajectory-level GRPO advantage (S,) of each row's trajectory: (R(tau) - mean) / F over
    the trajectories of its group, each counted once. A group of one trajectory gets 0.
    virtual_score: the groups count one virtual trajectory of this score (the module docstring)."""
    scores = _floats(episode_scores, "episode_scores")
    size, device = scores.shape[0], scores.device
    groups = _codes(traj_group_ids, size, "traj_group_ids", device)
    trajs = _codes(traj_ids, size, "traj_ids", device)
    return _episode_advantages(scores, groups, trajs, norm_std, eps, virtual_score)


@torch.no_grad()
def anchor_group_stats(traj_group_ids: Ids, state_hashes: Ids) -> dict[str, float]:
    """How much step-level signal GiGPO can find in a batch: rows pooled by (group, state hash).

    `nonsingleton_frac`: the fraction of rows whose anchor group has >= 2 rows (only those get a
    step advantage); `mean_size`: the anchor-group size seen from an average row;
    `num_groups`: the number of anchor groups. An empty batch gives zeros.
    """
    size = len(traj_group_ids)
    if size == 0:
        return {"nonsingleton_frac": 0.0, "mean_size": 0.0, "num_groups": 0.0}
    groups = _codes(traj_group_ids, size, "traj_group_ids", torch.device("cpu"))
    anchors = _pair_codes(groups, _codes(state_hashes, size, "state_hashes", torch.device("cpu")))
    counts = torch.bincount(anchors)
    per_row = counts[anchors].double()
    return {
        "nonsingleton_frac": float((per_row >= 2).double().mean()),
        "mean_size": float(per_row.mean()),
        "num_groups": float((counts > 0).sum()),
    }


def broadcast_to_tokens(advantages: Tensor, response_mask: Tensor) -> Tensor:
    """Per-row advantages (S,) onto the generated tokens of each row: (S, T), 0 off the mask."""
    if advantages.shape != (response_mask.shape[0],):
        shapes = f"{tuple(advantages.shape)} and {tuple(response_mask.shape)}"
        raise ValueError(f"advantages (S,) and response_mask (S, T) disagree: {shapes}")
    return advantages[:, None] * response_mask.to(advantages.dtype)
