"""The shipped example configs validate, and overrides can add optional sections to them."""

from pathlib import Path

import pytest

from roll.configs import ConfigError, load_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "frozen_lake"


@pytest.fixture
def pretrain(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    return f"pretrain={tmp_path}"


def test_step_wise_default_and_trajectory_variant(pretrain):
    step = load_config(str(EXAMPLES), "agent_val_frozen_lake", [pretrain])
    traj = load_config(str(EXAMPLES), "agent_val_frozen_lake_traj", [pretrain])
    assert (step.adv_estimator, step.train_env_manager.env_manager_type) == ("gigpo", "step")
    assert (traj.adv_estimator, traj.train_env_manager.env_manager_type) == ("grpo", "traj")
    assert traj.val_env_manager.env_manager_type == "traj"
    assert step.train_groups_per_step == 32 and step.val_groups_per_eval == 128
    assert traj.actor_train.training_args.mini_batch_size == 128


def test_override_adds_a_section_the_yaml_leaves_out(pretrain):
    cfg = load_config(
        str(EXAMPLES),
        "agent_val_frozen_lake_traj",
        [pretrain, "adv_estimator=gae", "critic.strategy_args.strategy_name=torch"],
    )
    assert cfg.critic.strategy_args.strategy_name == "torch"
    assert cfg.critic.model_args.model_name_or_path == cfg.pretrain
    with pytest.raises(ConfigError, match=r"^critic\.strategy_args\.strategy_nam: unknown key"):
        load_config(
            str(EXAMPLES),
            "agent_val_frozen_lake_traj",
            [pretrain, "adv_estimator=gae", "critic.strategy_args.strategy_nam=torch"],
        )


def test_gigpo_needs_step_wise_samples(pretrain):
    with pytest.raises(ConfigError, match='^adv_estimator: "gigpo" needs train_env_manager.env_manager_type "step"'):
        load_config(str(EXAMPLES), "agent_val_frozen_lake_traj", [pretrain, "adv_estimator=gigpo"])


def test_the_virtual_max_score_reaches_the_score_phase_and_only_group_relative_step_estimators(pretrain):
    from roll.pipeline.setup.builders import build_advantage_options

    cfg = load_config(str(EXAMPLES), "agent_val_frozen_lake", [pretrain, "virtual_max_score=1.0"])
    assert build_advantage_options(cfg).virtual_score == 1.0
    assert (
        build_advantage_options(load_config(str(EXAMPLES), "agent_val_frozen_lake", [pretrain])).virtual_score is None
    )
    refused = '^virtual_max_score: applies to step-wise "grpo" and "gigpo" only'
    with pytest.raises(ConfigError, match=refused):
        load_config(str(EXAMPLES), "agent_val_frozen_lake_traj", [pretrain, "virtual_max_score=1.0"])
    with pytest.raises(ConfigError, match=refused):
        load_config(
            str(EXAMPLES), "agent_val_frozen_lake", [pretrain, "virtual_max_score=1.0", "adv_estimator=step_reinforce"]
        )


def test_an_override_inside_a_library_entry_keeps_the_rest_of_the_entry(pretrain):
    # custom_envs.FrozenLake is `${custom_env.TinyFrozenLake}` (configs/step_envs.yaml): hydra alone
    # would replace it by {env_config: {size: 5}} and lose env_type, max_steps, ...
    cfg = load_config(
        str(EXAMPLES),
        "agent_val_frozen_lake",
        [
            pretrain,
            "custom_envs.FrozenLake.env_config.size=5",
            "custom_envs.FrozenLake.env_config.fault_injection.raise_p=0.04",
        ],
    )
    env = cfg.custom_envs["FrozenLake"]
    assert (env.env_type, env.max_steps, env.max_tokens_per_step) == ("frozen_lake", 8, 1)
    assert env.env_config == {
        "size": 5,
        "hole_prob": 0.2,
        "is_slippery": False,
        "max_path_length": 8,
        "format_penalty": -0.1,
        "show_neighbours": True,
        "fault_injection": {"raise_p": 0.04},
    }
