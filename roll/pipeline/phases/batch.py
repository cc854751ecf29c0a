"""Trajectories -> one right-padded training batch, and rollout statistics."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
import torch
from tensordict import TensorDict

from roll.algorithms.batch_adjust import adjusted_rows, rows_divisor
from roll.algorithms.filters import group_reward_std_stats, select_groups_by_reward_std
from roll.core.fields import Batch, RowInfo
from roll.core.padding import flat, length_mask, padded
from roll.core.records import ImageInputs, Trajectory
from roll.core.seeding import derive_seed
from roll.distributed.ranks import data_parallel_ranks
from roll.distributed.row_images import image_hashes


def build_traj_batch(trajs: list[Trajectory], pad_token_id: int) -> tuple[TensorDict, RowInfo]:
    """One row per trajectory. Tensors (B, T), aligned to token positions:
    input_ids, attention_mask, response_mask (1.0 on generated tokens), infer_logprobs,
    token_level_rewards (each step reward on the last generated token of its turn); for episodes
    with images (VL managers) also `Batch.PIXEL_VALUES` and `Batch.IMAGE_GRID_THW` (`image_batch`).
    The second value holds per-row ids and scores: traj_group_id, traj_id, tag, truncated,
    scores (B,).
    """
    b, t = len(trajs), max(len(tr.token_ids) for tr in trajs)
    for tr in trajs:
        if not len(tr.token_ids) == len(tr.response_mask) == len(tr.infer_logprobs):
            raise ValueError(f"trajectory {tr.traj_id}: token_ids, response_mask and infer_logprobs differ in length")
    input_ids = torch.from_numpy(padded([tr.token_ids for tr in trajs], t, pad_token_id, np.int64))
    attention_mask = torch.from_numpy(length_mask([len(tr.token_ids) for tr in trajs], t).astype(np.int64))
    response_mask = torch.from_numpy(padded([tr.response_mask for tr in trajs], t, 0, np.float32))
    infer_logprobs = torch.from_numpy(padded([tr.infer_logprobs for tr in trajs], t, 0, np.float32))
    versions = torch.from_numpy(padded([traj_token_versions(tr) for tr in trajs], t, -1, np.int64))
    rewards = torch.zeros((b, t))
    for i, tr in enumerate(trajs):
        for pos, r in zip(tr.turn_end_positions, tr.step_rewards):
            rewards[i, pos] += r
    batch = TensorDict(
        {
            Batch.INPUT_IDS: input_ids,
            Batch.ATTENTION_MASK: attention_mask,
            Batch.RESPONSE_MASK: response_mask,
            Batch.INFER_LOGPROBS: infer_logprobs,
            Batch.POLICY_VERSION: versions,
            Batch.TOKEN_LEVEL_REWARDS: rewards,
        },
        batch_size=[b],
    )
    if any(tr.images is not None for tr in trajs):
        batch.update(image_batch([tr.images for tr in trajs]))
    rows = RowInfo(
        traj_group_id=[tr.traj_group_id for tr in trajs],
        traj_id=[tr.traj_id for tr in trajs],
        tag=[tr.tag for tr in trajs],
        truncated=torch.tensor([tr.truncated for tr in trajs], dtype=torch.bool),
        scores=torch.tensor([tr.episode_reward for tr in trajs]),
    )
    return batch, rows


def traj_token_versions(tr: Trajectory) -> list[int]:
    """Per token of a trajectory-wise sample, the version that sampled it (-1 where the policy
    did not); a trajectory made without them (an old recording) gives its `policy_version`."""
    if tr.token_versions:
        return tr.token_versions
    return [tr.policy_version if m else -1 for m in tr.response_mask]


def image_batch(images: list[ImageInputs | None]) -> dict[str, torch.Tensor]:
    """Each row's images, zero-padded: pixel values (B, P, D) and patch grids (B, N, 3)
    (`Batch.PIXEL_VALUES`, `Batch.IMAGE_GRID_THW`; `roll.distributed.row_images.vision_inputs`
    cuts the padding again), and their hashes (`Batch.IMAGE_HASH`). Every row of a VL batch (a
    trajectory, or a step) must carry its images."""
    if any(row is None for row in images):
        raise ValueError("a batch mixes samples with and without images")
    rows: list[ImageInputs] = [row for row in images if row is not None]
    pixels = [torch.as_tensor(row.pixel_values, dtype=torch.float32) for row in rows]
    patches, dim = max(p.shape[0] for p in pixels), pixels[0].shape[1]
    pixel_values = torch.zeros((len(rows), patches, dim))
    grids = torch.zeros((len(rows), max(row.num_images for row in rows), 3), dtype=torch.long)
    for i, (row, p) in enumerate(zip(rows, pixels)):
        pixel_values[i, : p.shape[0]] = p
        grids[i, : row.num_images] = torch.tensor(row.image_grid_thw)
    hashes = image_hashes(pixel_values, grids)
    return {Batch.PIXEL_VALUES: pixel_values, Batch.IMAGE_GRID_THW: grids, Batch.IMAGE_HASH: hashes}


def build_step_batch(trajs: list[Trajectory], pad_token_id: int) -> tuple[TensorDict, RowInfo]:
    """One row per env step (step-wise managers): prompt + response ids, right-padded.
    Tensors as in `build_traj_batch` (no token rewards: step-wise advantages are per row), with
    each step's own images when its manager is a VL one (`image_batch`).
    Per-row ids: traj_group_id, traj_id, tag, truncated, step, state_hash, step_rewards (S,),
    episode_scores (S,) (the trajectory's total reward, repeated on each of its steps).
    """
    rows = [(tr, st) for tr in trajs for st in tr.steps]
    steps = [st for _, st in rows]
    b = len(steps)
    ids = [st.prompt_ids + st.response_ids for st in steps]
    t = max(map(len, ids))
    prompt_lengths = np.fromiter((len(st.prompt_ids) for st in steps), dtype=np.int64, count=b)
    input_ids = torch.from_numpy(padded(ids, t, pad_token_id, np.int64))
    attended = length_mask([len(row) for row in ids], t)
    attention_mask = torch.from_numpy(attended.astype(np.int64))
    # the response of row i sits at positions prompt_lengths[i] .. its length
    response = (np.arange(t) >= prompt_lengths[:, None]) & attended
    response_mask = torch.from_numpy(response.astype(np.float32))
    logprobs = np.zeros((b, t), dtype=np.float32)
    logprobs[response] = flat([st.logprobs for st in steps], np.float32, int(response.sum()))
    infer_logprobs = torch.from_numpy(logprobs)
    versions = np.full((b, t), -1, dtype=np.int64)
    step_versions = [st.versions or [tr.policy_version] * len(st.response_ids) for tr, st in rows]
    versions[response] = flat(step_versions, np.int64, int(response.sum()))
    batch = TensorDict(
        {
            Batch.INPUT_IDS: input_ids,
            Batch.ATTENTION_MASK: attention_mask,
            Batch.RESPONSE_MASK: response_mask,
            Batch.INFER_LOGPROBS: infer_logprobs,
            Batch.POLICY_VERSION: torch.from_numpy(versions),
        },
        batch_size=[b],
    )
    if any(st.images is not None for _, st in rows):
        batch.update(image_batch([st.images for _, st in rows]))
    info = RowInfo(
        traj_group_id=[tr.traj_group_id for tr, _ in rows],
        traj_id=[tr.traj_id for tr, _ in rows],
        tag=[tr.tag for tr, _ in rows],
        truncated=torch.tensor([tr.truncated for tr, _ in rows], dtype=torch.bool),
        step=[st.step for _, st in rows],
        state_hash=[st.state_hash for _, st in rows],
        step_rewards=torch.tensor([st.reward for _, st in rows]),
        episode_scores=torch.tensor([tr.episode_reward for tr, _ in rows]),
    )
    return batch, info


def filter_groups(trajs: list[Trajectory], keep_ratio: float) -> tuple[list[Trajectory], dict[str, float]]:
    """StarPO-S: keep the groups with the largest spread of episode rewards (one score per
    trajectory, so long trajectories do not weigh more); whole groups, in their original order."""
    scores = torch.tensor([tr.episode_reward for tr in trajs])
    groups = [tr.traj_group_id for tr in trajs]
    metrics = group_reward_std_stats(scores, groups)
    if keep_ratio < 1.0:
        trajs = [trajs[i] for i in select_groups_by_reward_std(scores, groups, keep_ratio=keep_ratio)]
    metrics["rollout/kept_trajectories"] = float(len(trajs))
    return trajs, metrics


def staleness_metrics(trajs: list[Trajectory], policy_version: int) -> dict[str, float]:
    """How far behind the trained policy the batch was generated (async training). Per trajectory,
    staleness = `policy_version` (the weights being trained) minus the version of its oldest
    token; `rollout/mixed_version_trajectories` is the fraction whose tokens span more than one
    version. Trajectories without a generated token count as fresh (staleness 0). Per generated
    token, lag = `policy_version` minus the version that sampled it:
    `rollout/tokens_by_version_lag/<lag>` is the fraction of the batch's tokens at each lag seen
    (a histogram), and `rollout/token_lag_mean` their mean."""
    if not trajs:
        return {}
    versions = [tr.generated_token_versions() for tr in trajs]
    # a turn's version is its oldest token's (`Trajectory.policy_versions`)
    staleness = [policy_version - v if (v := tr.oldest_policy_version) is not None else 0 for tr in trajs]
    mixed = [len(set(v or tr.policy_versions)) > 1 for v, tr in zip(versions, trajs, strict=True)]
    lags = np.asarray([policy_version - x for v in versions for x in v], dtype=np.int64)
    out = {
        "rollout/staleness_mean": float(np.mean(staleness)),
        "rollout/staleness_max": float(max(staleness)),
        "rollout/mixed_version_trajectories": float(np.mean(mixed)),
        "rollout/token_lag_mean": float(lags.mean()) if lags.size else 0.0,
    }
    if lags.size:
        counts = np.bincount(np.clip(lags, 0, None))
        out.update({f"rollout/tokens_by_version_lag/{lag}": n / lags.size for lag, n in enumerate(counts) if n})
    return out


def summarize_trajectories(trajs: list[Trajectory], prefix: str) -> dict[str, float]:
    """Episode statistics under `prefix/` (e.g. train/success); per tag too when there are several,
    with each tag's share of the trajectories (`prefix/<tag>/share`)."""
    if not trajs:
        return {}
    out = _summary(trajs, prefix)
    by_tag = defaultdict(list)
    for tr in trajs:
        by_tag[tr.tag].append(tr)
    if len(by_tag) > 1:
        for tag, group in by_tag.items():
            out.update(_summary(group, f"{prefix}/{tag}"))
            out[f"{prefix}/{tag}/share"] = len(group) / len(trajs)  # of the step's trajectories
    return out


def _summary(trajs: list[Trajectory], prefix: str) -> dict[str, float]:
    n_actions = sum(tr.num_actions for tr in trajs)
    out = {
        f"{prefix}/success": float(np.mean([tr.success for tr in trajs])),
        f"{prefix}/episode_reward": float(np.mean([tr.episode_reward for tr in trajs])),
        f"{prefix}/num_actions": n_actions / len(trajs),
        f"{prefix}/valid_action_ratio": sum(tr.num_valid_actions for tr in trajs) / max(n_actions, 1),
        f"{prefix}/response_tokens": float(np.mean([tr.num_generated_tokens for tr in trajs])),
        f"{prefix}/tokens_per_episode": float(np.mean([tr.num_tokens for tr in trajs])),
    }
    for reason, count in Counter(tr.stop_reason for tr in trajs).items():
        out[f"{prefix}/stop_{reason}"] = count / len(trajs)
    keys = sorted({k for tr in trajs for k in tr.metrics})
    for k in keys:
        vals = [tr.metrics[k] for tr in trajs if k in tr.metrics]
        out[f"{prefix}/env/{k}"] = float(np.mean(vals))
    return out


def batch_divisor(cfg, roles: list[str]) -> int:
    """ROLL's `batch_adjust_mode` divisor (roll.algorithms.batch_adjust): the least common multiple
    of each trained role's rows per optimizer step (per_device_train_batch_size x
    gradient_accumulation_steps x data-parallel ranks) and each role's rows per forward-only call
    (infer_batch_size, or per_device_train_batch_size when unset, x ranks). `roles`: the config
    sections the run builds among actor_train, critic and reference (which only infers)."""
    sizes = []
    for role in roles:
        worker, options = getattr(cfg, role), getattr(cfg, role).strategy_args.strategy_config
        ranks = len(
            set(
                data_parallel_ranks(
                    worker.world_size,
                    options.get("tensor_model_parallel_size", 1),
                    options.get("pipeline_model_parallel_size", 1),
                )
            )
        )
        args = worker.training_args
        if role != "reference":
            sizes.append(args.per_device_train_batch_size * args.gradient_accumulation_steps * ranks)
        sizes.append((worker.infer_batch_size or args.per_device_train_batch_size) * ranks)
    return rows_divisor(sizes)


def adjust_batch(
    batch: TensorDict, mode: str | None, divisor: int, seed: int, step: int
) -> tuple[TensorDict, dict[str, float]]:
    """`batch` with rows copied or deleted per ROLL's `batch_adjust_mode` (`adjusted_rows`, drawn
    from `derive_seed(seed, "batch_adjust", step)`), and ROLL's counts `system/batch_add_count`,
    `system/batch_remove_count`; `mode` None: `batch` as it is."""
    size = batch.batch_size[0]
    if mode is None:
        return batch, {"system/batch_add_count": 0.0, "system/batch_remove_count": 0.0}
    rng = np.random.default_rng(derive_seed(seed, "batch_adjust", step))
    rows = adjusted_rows(size, divisor, mode, rng)
    kept = len(np.unique(rows))
    metrics = {"system/batch_add_count": float(len(rows) - kept), "system/batch_remove_count": float(size - kept)}
    return (batch if len(rows) == size and kept == size else batch[torch.as_tensor(rows)]), metrics
