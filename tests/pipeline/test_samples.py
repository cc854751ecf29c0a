"""Trajectories -> batches: padding, masks, rewards at turn ends, step rows, group filtering."""

import torch

from roll.core.records import StepRecord, Trajectory
from roll.pipeline.samples import build_step_batch, build_traj_batch, filter_groups


def traj(group, member, rewards, **kw):
    return Trajectory(tag="T", traj_group_id=group, traj_id=f"{group}-{member}", env_seed=0,
                      step_rewards=rewards, success=False, stop_reason="max_steps", policy_version=0,
                      num_actions=len(rewards), num_valid_actions=len(rewards), **kw)


def test_traj_batch_places_step_rewards_at_turn_ends():
    a = traj("g", 0, [0.5, 1.0], token_ids=[1, 2, 3, 4, 5], response_mask=[0, 1, 0, 0, 1],
             infer_logprobs=[0, -0.1, 0, 0, -0.2], turn_end_positions=[1, 4])
    b = traj("g", 1, [-0.1], token_ids=[1, 2, 9], response_mask=[0, 0, 1],
             infer_logprobs=[0, 0, -0.3], turn_end_positions=[2])
    batch, meta = build_traj_batch([a, b], pad_token_id=0)
    torch.testing.assert_close(batch["input_ids"], torch.tensor([[1, 2, 3, 4, 5], [1, 2, 9, 0, 0]]))
    torch.testing.assert_close(batch["attention_mask"], torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]))
    torch.testing.assert_close(batch["response_mask"], torch.tensor([[0., 1, 0, 0, 1], [0, 0, 1, 0, 0]]))
    torch.testing.assert_close(batch["token_level_rewards"], torch.tensor([[0., .5, 0, 0, 1], [0, 0, -.1, 0, 0]]))
    torch.testing.assert_close(meta.scores, torch.tensor([1.5, -0.1]))
    assert meta.truncated.tolist() == [True, True]  # both were cut by max_steps


def test_only_terminated_trajectories_are_not_truncated():
    reasons = ["terminated", "truncated", "max_steps", "max_tokens"]
    trajs = [traj("g", i, [1.0], token_ids=[1, 2], response_mask=[0, 1], infer_logprobs=[0, -0.1],
                  turn_end_positions=[1]) for i in range(4)]
    for tr, reason in zip(trajs, reasons):
        tr.stop_reason = reason
    _, rows = build_traj_batch(trajs, pad_token_id=0)
    assert rows.truncated.tolist() == [False, True, True, True]


def test_step_batch_has_one_row_per_step():
    steps = [StepRecord(0, [1, 2], [7], [-0.5], 0.0, "h0"), StepRecord(1, [1, 3, 3], [8], [-0.25], 1.0, "h1")]
    batch, meta = build_step_batch([traj("g", 0, [0.0, 1.0], steps=steps)], pad_token_id=0)
    torch.testing.assert_close(batch["input_ids"], torch.tensor([[1, 2, 7, 0], [1, 3, 3, 8]]))
    torch.testing.assert_close(batch["response_mask"], torch.tensor([[0., 0, 1, 0], [0, 0, 0, 1]]))
    torch.testing.assert_close(batch["infer_logprobs"], torch.tensor([[0., 0, -0.5, 0], [0, 0, 0, -0.25]]))
    assert meta.step == [0, 1] and meta.state_hash == ["h0", "h1"]
    torch.testing.assert_close(meta.episode_scores, torch.tensor([1.0, 1.0]))
    torch.testing.assert_close(meta.step_rewards, torch.tensor([0.0, 1.0]))


def test_filter_keeps_the_groups_with_most_reward_spread():
    trajs = [traj("flat", 0, [1.0]), traj("flat", 1, [1.0]),
             traj("spread", 0, [0.0]), traj("spread", 1, [1.0])]
    kept, metrics = filter_groups(trajs, keep_ratio=0.5)
    assert [t.traj_id for t in kept] == ["spread-0", "spread-1"]
    assert metrics["rollout/groups_with_variance"] == 0.5 and metrics["rollout/kept_trajectories"] == 2
    kept_all, _ = filter_groups(trajs, keep_ratio=1.0)
    assert kept_all == trajs
