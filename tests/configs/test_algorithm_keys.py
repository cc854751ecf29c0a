"""ROLL's algorithm keys: pg_variant and its parameters, the KL loss, reward normalisation and
clipping, where they sit in the YAML and what they default to."""

from __future__ import annotations

import os
from typing import get_args

import pytest

from roll.algorithms.kl import KL_KINDS
from roll.algorithms.pg_variants import PG_VARIANTS
from roll.configs import ConfigError, load_config
from roll.configs.pipeline import PipelineConfig
from roll.configs.roll_compat.dialect import old_logprobs_in_train, old_logprobs_pass_needed
from roll.configs.worker import WorkerConfig

CONFIG_DIR = os.path.dirname(os.path.abspath(__file__))
REFERENCE = "+reference.strategy_args.strategy_name=torch"
STEP_WISE = ["train_env_manager.env_manager_type=step", "adv_estimator=gigpo"]


def load(model_dir, *overrides):
    return load_config(CONFIG_DIR, "minimal_agentic", [f"pretrain={model_dir}", *overrides])


def test_config_names_match_the_registries():
    assert set(get_args(WorkerConfig.model_fields["pg_variant"].annotation)) == set(PG_VARIANTS)
    for key in ("kl_penalty", "kl_loss_type"):
        assert set(get_args(PipelineConfig.model_fields[key].annotation)) == set(KL_KINDS)


def test_defaults_keep_ppo_and_no_kl_loss(model_dir):
    cfg = load(model_dir)
    assert cfg.actor_train.pg_variant == "ppo"
    assert (cfg.use_kl_loss, cfg.kl_loss_coef, cfg.kl_loss_type, cfg.kl_penalty) == (False, 0.0, "low_var_kl", "kl")
    assert not cfg.uses_kl and "reference" not in cfg.built_roles


def test_kl_loss_needs_and_starts_the_reference(model_dir):
    with pytest.raises(ConfigError, match="^reference: required when .* use_kl_loss is on$"):
        load(model_dir, "use_kl_loss=true", "kl_loss_coef=0.01")
    cfg = load(model_dir, REFERENCE, "use_kl_loss=true", "kl_loss_coef=0.01")
    assert cfg.uses_kl and not cfg.uses_kl_penalty and "reference" in cfg.built_roles


def test_step_wise_samples_take_the_kl_loss_but_not_the_penalty(model_dir):
    cfg = load(model_dir, *STEP_WISE, REFERENCE, "use_kl_loss=true", "kl_loss_coef=0.01", "kl_loss_type=mse")
    assert "reference" in cfg.built_roles and cfg.kl_loss_type == "mse"
    with pytest.raises(ConfigError, match="^init_kl_coef: the KL penalty is not available"):
        load(model_dir, *STEP_WISE, REFERENCE, "init_kl_coef=0.1")


def test_pg_variant_keys_sit_on_actor_train(model_dir):
    cfg = load(
        model_dir,
        "+actor_train.pg_variant=cispo",
        "+actor_train.cispo_epsilon_high=0.3",
        "+actor_train.cispo_use_unified_mask=true",
    )
    assert (cfg.actor_train.pg_variant, cfg.actor_train.cispo_epsilon_high) == ("cispo", 0.3)
    assert cfg.actor_train.cispo_use_unified_mask


def test_kl_full_is_refused_by_name(model_dir):
    with pytest.raises(ConfigError, match="^kl_penalty: input should be"):
        load(model_dir, "kl_penalty=full")


def test_roll_reward_normalization_block_and_clips(model_dir):
    cfg = load(
        model_dir, "+reward_normalization={grouping: tags, method: asym_clip}", "reward_clip=20", "advantage_clip=0.2"
    )
    norm = cfg.reward_normalization
    assert (norm.group_key, norm.norm_mean_type, norm.norm_std_type, norm.clip_range) == (
        "tag",
        "group",
        "group",
        (-1.0, 3.0),
    )
    assert (cfg.reward_clip, cfg.advantage_clip) == (20.0, 0.2)
    assert (load(model_dir).reward_clip, load(model_dir).advantage_clip) == (None, None)
    with pytest.raises(ConfigError, match="^reward_normalization.method: input should be"):
        load(model_dir, "+reward_normalization={method: rank}")
    with pytest.raises(ConfigError, match="^advantage_clip: input should be greater than 0"):
        load(model_dir, "advantage_clip=0")


def test_old_logprobs_are_taken_in_training_unless_a_key_or_the_run_needs_a_pass(model_dir):
    """ROLL's enable_old_logprobs_recompute: false (its default) takes them in the actor's training
    call; true, a KL penalty in the rewards or a megatron actor give the score phase's pass."""
    assert old_logprobs_in_train(load(model_dir))
    assert not old_logprobs_in_train(load(model_dir, "enable_old_logprobs_recompute=true"))
    both = ("enable_old_logprobs_recompute=true", "force_disable_old_logprobs_recompute=true")
    assert old_logprobs_in_train(load(model_dir, *both))
    penalty = load(model_dir, REFERENCE, "init_kl_coef=0.1")
    assert not old_logprobs_in_train(penalty)
    assert "KL penalty in the rewards" in old_logprobs_pass_needed(penalty)
    megatron = load(model_dir, "actor_train.strategy_args.strategy_name=megatron_train")
    assert not old_logprobs_in_train(megatron) and "megatron" in old_logprobs_pass_needed(megatron)
    assert old_logprobs_in_train(load(model_dir, REFERENCE, "use_kl_loss=true", "kl_loss_coef=0.01"))


def test_forcing_old_logprobs_into_training_is_refused_where_a_pass_is_needed(model_dir):
    with pytest.raises(ConfigError, match=r"^force_disable_old_logprobs_recompute: the KL penalty in the rewards"):
        load(model_dir, REFERENCE, "init_kl_coef=0.1", "force_disable_old_logprobs_recompute=true")
