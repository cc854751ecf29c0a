"""Trajectories -> batches: padding, masks, rewards at turn ends, step rows, group filtering."""

from types import SimpleNamespace

import torch
from tensordict import TensorDict

from roll.core.records import StepRecord, Trajectory
from roll.pipeline.phases.batch import adjust_batch, batch_divisor, build_step_batch, build_traj_batch, filter_groups


def traj(group, member, rewards, **kw):
    return Trajectory(
        tag="T",
        traj_group_id=group,
        traj_id=f"{group}-{member}",
        env_seed=0,
        step_rewards=rewards,
        success=False,
        stop_reason="max_steps",
        policy_version=0,
        num_actions=len(rewards),
        num_valid_actions=len(rewards),
        **kw,
    )


def test_traj_batch_places_step_rewards_at_turn_ends():
    a = traj(
        "g",
        0,
        [0.5, 1.0],
        token_ids=[1, 2, 3, 4, 5],
        response_mask=[0, 1, 0, 0, 1],
        infer_logprobs=[0, -0.1, 0, 0, -0.2],
        turn_end_positions=[1, 4],
    )
    b = traj(
        "g",
        1,
        [-0.1],
        token_ids=[1, 2, 9],
        response_mask=[0, 0, 1],
        infer_logprobs=[0, 0, -0.3],
        turn_end_positions=[2],
    )
    a.token_versions = [-1, 2, -1, -1, 3]  # b has none: its policy_version (0) on its generated id
    batch, meta = build_traj_batch([a, b], pad_token_id=0)
    torch.testing.assert_close(batch["input_ids"], torch.tensor([[1, 2, 3, 4, 5], [1, 2, 9, 0, 0]]))
    assert batch["policy_version"].tolist() == [[-1, 2, -1, -1, 3], [-1, -1, 0, -1, -1]]
    torch.testing.assert_close(batch["attention_mask"], torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]))
    torch.testing.assert_close(batch["response_mask"], torch.tensor([[0.0, 1, 0, 0, 1], [0, 0, 1, 0, 0]]))
    torch.testing.assert_close(batch["token_level_rewards"], torch.tensor([[0.0, 0.5, 0, 0, 1], [0, 0, -0.1, 0, 0]]))
    torch.testing.assert_close(meta.scores, torch.tensor([1.5, -0.1]))
    assert meta.truncated.tolist() == [True, True]  # both were cut by max_steps


def test_only_terminated_trajectories_are_not_truncated():
    reasons = ["terminated", "truncated", "max_steps", "max_tokens"]
    trajs = [
        traj("g", i, [1.0], token_ids=[1, 2], response_mask=[0, 1], infer_logprobs=[0, -0.1], turn_end_positions=[1])
        for i in range(4)
    ]
    for tr, reason in zip(trajs, reasons):
        tr.stop_reason = reason
    _, rows = build_traj_batch(trajs, pad_token_id=0)
    assert rows.truncated.tolist() == [False, True, True, True]


def test_step_batch_has_one_row_per_step():
    steps = [
        StepRecord(0, [1, 2], [7], [-0.5], 0.0, "h0", versions=[3]),
        StepRecord(1, [1, 3, 3], [8], [-0.25], 1.0, "h1"),  # no versions: the trajectory's (0)
    ]
    batch, meta = build_step_batch([traj("g", 0, [0.0, 1.0], steps=steps)], pad_token_id=0)
    assert batch["policy_version"].tolist() == [[-1, -1, 3, -1], [-1, -1, -1, 0]]
    torch.testing.assert_close(batch["input_ids"], torch.tensor([[1, 2, 7, 0], [1, 3, 3, 8]]))
    torch.testing.assert_close(batch["response_mask"], torch.tensor([[0.0, 0, 1, 0], [0, 0, 0, 1]]))
    torch.testing.assert_close(batch["infer_logprobs"], torch.tensor([[0.0, 0, -0.5, 0], [0, 0, 0, -0.25]]))
    assert meta.step == [0, 1] and meta.state_hash == ["h0", "h1"]
    torch.testing.assert_close(meta.episode_scores, torch.tensor([1.0, 1.0]))
    torch.testing.assert_close(meta.step_rewards, torch.tensor([0.0, 1.0]))


def test_filter_keeps_the_groups_with_most_reward_spread():
    trajs = [traj("flat", 0, [1.0]), traj("flat", 1, [1.0]), traj("spread", 0, [0.0]), traj("spread", 1, [1.0])]
    kept, metrics = filter_groups(trajs, keep_ratio=0.5)
    assert [t.traj_id for t in kept] == ["spread-0", "spread-1"]
    assert metrics["rollout/groups_with_variance"] == 0.5 and metrics["rollout/kept_trajectories"] == 2
    kept_all, _ = filter_groups(trajs, keep_ratio=1.0)
    assert kept_all == trajs


def _role(world_size, per_device, accumulation, infer=None, **strategy_config):
    return SimpleNamespace(
        world_size=world_size,
        infer_batch_size=infer,
        strategy_args=SimpleNamespace(strategy_config=strategy_config),
        training_args=SimpleNamespace(per_device_train_batch_size=per_device, gradient_accumulation_steps=accumulation),
    )


def test_batch_divisor_is_rolls_least_common_multiple():
    """actor_train: 2 processes at TP 2 = 1 data-parallel rank, 2 x 3 rows per step, infers 2 (no
    infer_batch_size); reference: infers 4. lcm(6, 2, 4) = 12; without the reference lcm(6, 2) = 6."""
    cfg = SimpleNamespace(actor_train=_role(2, 2, 3, tensor_model_parallel_size=2), reference=_role(1, 1, 1, infer=4))
    assert batch_divisor(cfg, ["actor_train", "reference"]) == 12
    assert batch_divisor(cfg, ["actor_train"]) == 6


def test_adjust_batch_copies_or_deletes_rows_and_counts_them():
    batch = TensorDict({"input_ids": torch.arange(10)[:, None]}, batch_size=[10])
    copied, metrics = adjust_batch(batch, "copy", 4, seed=0, step=1)
    assert copied["input_ids"][:10, 0].tolist() == list(range(10)) and copied.batch_size[0] == 12
    assert metrics == {"system/batch_add_count": 2.0, "system/batch_remove_count": 0.0}
    deleted, metrics = adjust_batch(batch, "delete", 4, seed=0, step=1)
    assert deleted.batch_size[0] == 8 and metrics == {"system/batch_add_count": 0.0, "system/batch_remove_count": 2.0}
    again, _ = adjust_batch(batch, "delete", 4, seed=0, step=1)
    assert torch.equal(again["input_ids"], deleted["input_ids"])  # derived from (seed, step): repeatable
    whole, metrics = adjust_batch(batch, "copy", 5, seed=0, step=1)
    assert whole is batch and metrics["system/batch_add_count"] == 0


def test_adjust_batch_none_trains_the_batch_as_it_is():
    batch = TensorDict({"input_ids": torch.arange(10)[:, None]}, batch_size=[10])
    same, metrics = adjust_batch(batch, None, 4, seed=0, step=1)
    assert same is batch and metrics == {"system/batch_add_count": 0.0, "system/batch_remove_count": 0.0}
