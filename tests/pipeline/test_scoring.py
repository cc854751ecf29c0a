"""reward_normalization as the pipeline applies it: hand-derived numbers for both sample kinds."""

import pytest
import torch
from tensordict import TensorDict

from roll.algorithms.advantages import AdvantageOptions
from roll.configs.pipeline import RewardNormalization
from roll.core.fields import RowInfo
from roll.pipeline.phases.scoring import (
    clip_rewards,
    final_values,
    normalize_step_episode_scores,
    normalize_traj_rewards,
    score_batch,
    score_step_batch,
    with_final_state,
)


def _traj_batch(rewards, mask):
    rewards, mask = torch.tensor(rewards), torch.tensor(mask)
    return TensorDict({"token_level_rewards": rewards, "response_mask": mask}, batch_size=[len(mask)])


def test_traj_rows_get_the_normalised_score_on_their_last_generated_token():
    # scores: 1+2 = 3, 1, 0 and 4 (groups a: 3, 1 -> mean 2; b: 0, 4 -> mean 2)
    batch = _traj_batch(
        [[0, 1.0, 0, 2.0, 0], [0, 0, 1.0, 0, 0], [0, 0, 0, 0, 0], [4.0, 0, 0, 0, 0]],
        [[0, 1, 1, 1, 0], [0, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]],
    )
    meta = RowInfo(traj_group_id=["a", "a", "b", "b"], traj_id=["1", "2", "3", "4"], tag=["x"] * 4)
    normalize_traj_rewards(batch, meta, RewardNormalization(norm_mean_type="group", norm_std_type=None))
    assert batch["token_level_rewards"].tolist() == [
        [0, 0, 0, 1.0, 0],
        [0, 0, -1.0, 0, 0],
        [0, 0, 0, 0, -2.0],
        [2.0, 0, 0, 0, 0],
    ]


def test_traj_batch_whitening_divides_by_the_unbiased_batch_std():
    # scores 0, 0, 2, 2: batch mean 1, unbiased std sqrt(4/3) -> +-1/sqrt(4/3) = +-0.8660...
    batch = _traj_batch([[0.0, 0], [0, 0], [0, 2.0], [2.0, 0]], [[1, 1]] * 4)
    meta = RowInfo(traj_group_id=["a", "b", "c", "d"], traj_id=["1", "2", "3", "4"], tag=["x"] * 4)
    normalize_traj_rewards(
        batch, meta, RewardNormalization(grouping="batch", norm_mean_type="batch", norm_std_type="batch")
    )
    expected = 1 / (4 / 3) ** 0.5
    last = batch["token_level_rewards"][:, 1]
    assert last.tolist() == pytest.approx([-expected, -expected, expected, expected], abs=1e-5)
    assert batch["token_level_rewards"][:, 0].tolist() == [0, 0, 0, 0]


def test_step_rows_normalise_over_trajectories_not_rows():
    # t1 (3 steps, score 1) and t2 (1 step, score 0) in group g: the mean over trajectories is 0.5
    # (a mean over rows would be 0.75); t3 alone in group h has no spread -> 0.
    meta = RowInfo(
        traj_id=["t1", "t1", "t2", "t1", "t3"],
        traj_group_id=["g", "g", "g", "g", "h"],
        tag=["x"] * 5,
        episode_scores=torch.tensor([1.0, 1.0, 0.0, 1.0, 5.0]),
    )
    normalize_step_episode_scores(meta, RewardNormalization())
    assert meta.episode_scores.tolist() == [0.5, 0.5, -0.5, 0.5, 0.0]


def test_grouping_by_tag():
    meta = RowInfo(
        traj_id=["t1", "t2", "t3"],
        traj_group_id=["g1", "g2", "g3"],
        tag=["A", "A", "B"],
        episode_scores=torch.tensor([1.0, 3.0, 7.0]),
    )
    normalize_step_episode_scores(meta, RewardNormalization(grouping="tag"))
    assert meta.episode_scores.tolist() == [-1.0, 1.0, 0.0]


def test_the_critic_input_has_one_more_position_holding_the_last_state():
    # rows of length 3 and 1 (right-padded to T = 3): each gets one more attended position, at its
    # own length, so values (B, T + 1) of that input hold V(whole row) at index 3 and 1.
    batch = TensorDict(
        {"input_ids": torch.tensor([[5, 6, 7], [5, 0, 0]]), "attention_mask": torch.tensor([[1, 1, 1], [1, 0, 0]])},
        batch_size=[2],
    )
    critic_input = with_final_state(batch)
    assert critic_input["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert critic_input["input_ids"][:, :3].tolist() == batch["input_ids"].tolist()
    values = torch.tensor([[0.0, 1, 2, 3], [0, 9, 0, 0]])
    assert final_values(values, critic_input["attention_mask"]).tolist() == [3.0, 9.0]


def test_roll_method_and_tags_grouping():
    # ROLL's {grouping: tags, method: mean_std}: group mean and std per tag. Tag A: 1, 3 -> mean 2,
    # unbiased std sqrt(2): -1 / sqrt(2), +1 / sqrt(2); tag B alone: no spread -> 0.
    norm = RewardNormalization(grouping="tags", method="mean_std")
    assert (norm.norm_mean_type, norm.norm_std_type, norm.clip_range) == ("group", "group", None)
    meta = RowInfo(
        traj_id=["t1", "t2", "t3"],
        traj_group_id=["g1", "g2", "g3"],
        tag=["A", "A", "B"],
        episode_scores=torch.tensor([1.0, 3.0, 7.0]),
    )
    normalize_step_episode_scores(meta, norm)
    assert meta.episode_scores.tolist() == pytest.approx([-(2**-0.5), 2**-0.5, 0.0], abs=1e-5)


def test_explicit_norm_types_win_over_method():
    norm = RewardNormalization(grouping="batch", method="mean_std", norm_std_type=None)
    assert (norm.norm_mean_type, norm.norm_std_type) == ("batch", None)
    assert RewardNormalization(method="asym_clip").clip_range == (-1.0, 3.0)


def test_reward_clip_on_traj_rows_counts_rows():
    # limit 1: row 0's 2.0 -> 1.0 (clamped), row 1's -0.5 stays, row 2's -3.0 sits on a masked
    # (observation) token: clamped too, but the row does not count. 1 row of 3.
    batch = _traj_batch([[0, 2.0], [-0.5, 0], [-3.0, 0.5]], [[1, 1], [1, 1], [0, 1]])
    metrics = clip_rewards(
        batch, RowInfo(traj_group_id=["a"] * 3, traj_id=["1", "2", "3"], tag=["x"] * 3), 1.0, step_wise=False
    )
    assert batch["token_level_rewards"].tolist() == [[0, 1.0], [-0.5, 0], [-1.0, 0.5]]
    assert metrics == {"critic/reward_clip_frac": pytest.approx(1 / 3)}


def test_reward_clip_on_step_rows_clamps_episode_scores_and_step_rewards():
    # limit 2: episode scores 3 -> 2, -1 stays; step rewards 0.5 stays, -4 -> -2. Rows 0 and 1 clamp.
    meta = RowInfo(
        traj_group_id=["g"] * 3,
        traj_id=["t1", "t1", "t2"],
        tag=["x"] * 3,
        episode_scores=torch.tensor([3.0, 3.0, -1.0]),
        step_rewards=torch.tensor([0.5, -4.0, 0.5]),
    )
    metrics = clip_rewards(None, meta, 2.0, step_wise=True)
    assert meta.episode_scores.tolist() == [2.0, 2.0, -1.0]
    assert meta.step_rewards.tolist() == [0.5, -2.0, 0.5]
    assert metrics == {"critic/reward_clip_frac": pytest.approx(2 / 3)}


def test_advantage_clip_after_the_estimator():
    # reinforce, gamma 1: returns-to-go of row 0's rewards (0, 3) are 3, 3; row 1's (0, -0.5): -0.5,
    # -0.5. advantage_clip 1: 3 -> 1 on both of row 0's tokens: 2 of 4 generated tokens.
    batch = _traj_batch([[0.0, 3.0], [0.0, -0.5]], [[1, 1], [1, 1]])
    meta = RowInfo(traj_group_id=["a", "b"], traj_id=["1", "2"], tag=["x"] * 2)
    metrics = score_batch(batch, meta, AdvantageOptions("reinforce", advantage_clip=1.0), kl_coef=None)
    assert batch["advantages"].tolist() == [[1.0, 1.0], [-0.5, -0.5]]
    assert batch["returns"].tolist() == [[3.0, 3.0], [-0.5, -0.5]]
    assert metrics["critic/advantage_clip_frac"] == pytest.approx(0.5)


def test_step_reinforce_normalises_its_step_returns_as_roll():
    # gamma 1. Group g: t1 steps rewards (1, 2) -> returns 3, 2; t2 one step reward 1 -> 1. Group h:
    # t3 reward 4 -> 4. Group mean (ROLL's norm_mean_type group) over g's rows: 2, std None -> 1, 0, -1;
    # h alone -> 0. Each row's advantage is on its generated tokens.
    rows = RowInfo(
        traj_group_id=["g", "g", "g", "h"],
        traj_id=["t1", "t1", "t2", "t3"],
        tag=["x"] * 4,
        step=[0, 1, 0, 0],
        step_rewards=torch.tensor([1.0, 2.0, 1.0, 4.0]),
        episode_scores=torch.tensor([3.0, 3.0, 1.0, 4.0]),
        state_hash=["a", "b", "c", "d"],
    )
    mask = torch.tensor([[0, 1, 1], [0, 0, 1], [1, 1, 0], [0, 1, 0]])
    batch = TensorDict({"response_mask": mask}, batch_size=[4])
    norm = RewardNormalization(grouping="traj_group_id", norm_mean_type="group", norm_std_type=None)
    score_step_batch(batch, rows, AdvantageOptions("step_reinforce", return_norm=norm))
    assert batch["advantages"].tolist() == [[0, 1.0, 1.0], [0, 0, 0.0], [-1.0, -1.0, 0], [0, 0.0, 0]]


@pytest.mark.parametrize("estimator", ["grpo", "gigpo"])
def test_step_rows_of_a_group_that_all_failed_get_the_virtual_scores_negative_advantage(estimator):
    # One group, trajectories t1 (two steps) and t2 (one step), both scored 0; every state differs.
    # Without virtual_score: no spread, 0. With 1.0: per trajectory 0, 0, 1 -> mean 1/3, unbiased
    # std 1/sqrt(3) -> -1/sqrt(3) on each row's generated tokens (eps 1e-6 in the divisor).
    rows = RowInfo(
        traj_group_id=["g"] * 3,
        traj_id=["t1", "t1", "t2"],
        tag=["x"] * 3,
        step=[0, 1, 0],
        step_rewards=torch.zeros(3),
        episode_scores=torch.zeros(3),
        state_hash=["a", "b", "c"],
    )
    mask = torch.tensor([[0, 1], [1, 1], [1, 0]])
    for virtual, expected in ((None, 0.0), (1.0, -(1 / 3) / (3**-0.5 + 1e-6))):
        batch = TensorDict({"response_mask": mask}, batch_size=[3])
        score_step_batch(batch, rows, AdvantageOptions(estimator, step_reward_gamma=0.9, virtual_score=virtual))
        assert batch["advantages"] == pytest.approx(mask.float() * expected)


def _reinforce(batch, kl_coef: float | None = None, **options):
    meta = RowInfo(traj_group_id=["a", "b"], traj_id=["1", "2"], tag=["x", "x"])
    return score_batch(batch, meta, AdvantageOptions("reinforce", **options), kl_coef=kl_coef)


def test_whiten_rewards_whitens_token_rewards_before_the_estimator():
    # ROLL's whiten_rewards: rewards 0, 2 / 0, 0 on four generated tokens: mean 0.5, unbiased var
    # (3 * 0.25 + 2.25) / 3 = 1 -> -0.5, 1.5 / -0.5, -0.5; reinforce returns are suffix sums.
    batch = _traj_batch([[0.0, 2.0], [0.0, 0.0]], [[1, 1], [1, 1]])
    _reinforce(batch, whiten_rewards=True)
    assert batch["returns"].flatten().tolist() == pytest.approx([1.0, 1.5, -1.0, -0.5])
    batch = _traj_batch([[0.0, 2.0], [0.0, 0.0]], [[0, 1], [0, 0]])  # one generated token: no variance
    _reinforce(batch, whiten_rewards=True)
    assert batch["returns"].tolist() == [[0.0, 2.0], [0.0, 0.0]]  # unchanged (returns on generated tokens)


def test_add_token_level_kl_false_measures_the_kl_without_a_penalty():
    # old - ref log-probs: 0.5 on each of the two generated tokens (k1); controller value 0.1.
    from roll.pipeline.phases.scoring import reward_kl_coef

    assert reward_kl_coef(0.1, penalty_on=False, add_token_level_kl=True) is None
    assert reward_kl_coef(0.1, penalty_on=True, add_token_level_kl=None) == 0.1  # roll's own rule
    assert reward_kl_coef(0.1, penalty_on=True, add_token_level_kl=True) == 0.1
    for coef, last_reward in ((0.0, 1.0), (0.1, 0.95)):  # false: 0 -> rewards unchanged, KL still logged
        batch = _traj_batch([[0.0, 1.0], [0.0, 0.0]], [[0, 1], [0, 0]])
        batch["old_logprobs"] = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]])
        batch["ref_logprobs"] = torch.tensor([[-1.5, -1.5], [-1.5, -1.5]])
        metrics = _reinforce(batch, kl_coef=coef)
        assert batch["returns"][0, 1].item() == pytest.approx(last_reward)
        assert metrics["critic/kl"] == pytest.approx(0.5) and metrics["critic/kl_coef"] == coef
