"""reward_normalization as the pipeline applies it: hand-derived numbers for both sample kinds."""

import pytest
import torch
from tensordict import TensorDict

from roll.configs.pipeline import RewardNormalization
from roll.core.fields import RowInfo
from roll.pipeline.scoring import final_values, normalize_step_episode_scores, normalize_traj_rewards, with_final_state


def _traj_batch(rewards, mask):
    rewards, mask = torch.tensor(rewards), torch.tensor(mask)
    return TensorDict({"token_level_rewards": rewards, "response_mask": mask}, batch_size=[len(mask)])


def test_traj_rows_get_the_normalised_score_on_their_last_generated_token():
    # scores: 1+2 = 3, 1, 0 and 4 (groups a: 3, 1 -> mean 2; b: 0, 4 -> mean 2)
    batch = _traj_batch(
        [[0, 1.0, 0, 2.0, 0], [0, 0, 1.0, 0, 0], [0, 0, 0, 0, 0], [4.0, 0, 0, 0, 0]],
        [[0, 1, 1, 1, 0], [0, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    meta = RowInfo(traj_group_id=["a", "a", "b", "b"], traj_id=["1", "2", "3", "4"], tag=["x"] * 4)
    normalize_traj_rewards(batch, meta, RewardNormalization(norm_mean_type="group", norm_std_type=None))
    assert batch["token_level_rewards"].tolist() == [
        [0, 0, 0, 1.0, 0], [0, 0, -1.0, 0, 0], [0, 0, 0, 0, -2.0], [2.0, 0, 0, 0, 0]]


def test_traj_batch_whitening_divides_by_the_unbiased_batch_std():
    # scores 0, 0, 2, 2: batch mean 1, unbiased std sqrt(4/3) -> +-1/sqrt(4/3) = +-0.8660...
    batch = _traj_batch([[0.0, 0], [0, 0], [0, 2.0], [2.0, 0]], [[1, 1]] * 4)
    meta = RowInfo(traj_group_id=["a", "b", "c", "d"], traj_id=["1", "2", "3", "4"], tag=["x"] * 4)
    normalize_traj_rewards(batch, meta, RewardNormalization(grouping="batch", norm_mean_type="batch",
                                                            norm_std_type="batch"))
    expected = 1 / (4 / 3) ** 0.5
    last = batch["token_level_rewards"][:, 1]
    assert last.tolist() == pytest.approx([-expected, -expected, expected, expected], abs=1e-5)
    assert batch["token_level_rewards"][:, 0].tolist() == [0, 0, 0, 0]


def test_step_rows_normalise_over_trajectories_not_rows():
    # t1 (3 steps, score 1) and t2 (1 step, score 0) in group g: the mean over trajectories is 0.5
    # (a mean over rows would be 0.75); t3 alone in group h has no spread -> 0.
    meta = RowInfo(traj_id=["t1", "t1", "t2", "t1", "t3"], traj_group_id=["g", "g", "g", "g", "h"],
                   tag=["x"] * 5, episode_scores=torch.tensor([1.0, 1.0, 0.0, 1.0, 5.0]))
    normalize_step_episode_scores(meta, RewardNormalization())
    assert meta.episode_scores.tolist() == [0.5, 0.5, -0.5, 0.5, 0.0]


def test_grouping_by_tag():
    meta = RowInfo(traj_id=["t1", "t2", "t3"], traj_group_id=["g1", "g2", "g3"], tag=["A", "A", "B"],
                   episode_scores=torch.tensor([1.0, 3.0, 7.0]))
    normalize_step_episode_scores(meta, RewardNormalization(grouping="tag"))
    assert meta.episode_scores.tolist() == [-1.0, 1.0, 0.0]


def test_the_critic_input_has_one_more_position_holding_the_last_state():
    # rows of length 3 and 1 (right-padded to T = 3): each gets one more attended position, at its
    # own length, so values (B, T + 1) of that input hold V(whole row) at index 3 and 1.
    batch = TensorDict({"input_ids": torch.tensor([[5, 6, 7], [5, 0, 0]]),
                        "attention_mask": torch.tensor([[1, 1, 1], [1, 0, 0]])}, batch_size=[2])
    critic_input = with_final_state(batch)
    assert critic_input["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert critic_input["input_ids"][:, :3].tolist() == batch["input_ids"].tolist()
    values = torch.tensor([[0.0, 1, 2, 3], [0, 9, 0, 0]])
    assert final_values(values, critic_input["attention_mask"]).tolist() == [3.0, 9.0]
