"""ROLL keys with a plain meaning on one machine (rpc_timeout, use_remove_padding, ulysses_size,
fsdp2_infer, top_k -1, warmup_ratio, env-manager system_envs, env libraries under other names) and
ROLL features refused by name (roll.configs.roll_compat.unsupported), on YAMLs of our own in ROLL's dialect."""

from pathlib import Path

import pytest

from roll.configs import ConfigError, load_config

HERE = Path(__file__).parent / "roll_dialect" / "runs"
HF = ("actor_infer.strategy_args.strategy_name=hf_infer", "~actor_infer.strategy_args.strategy_config")


def load(model_dir, name, *overrides):
    return load_config(str(HERE), name, [f"pretrain={model_dir}", f"reward_pretrain={model_dir}", *overrides])


def test_plumbing_keys_keep_rolls_meaning(model_dir):
    cfg = load(model_dir, "plumbing_keys", "+profile=cpu_smoke")
    assert cfg.rpc_timeout == 72000 and cfg.profiler_memory is False
    assert cfg.actor_train.use_remove_padding is True
    assert cfg.actor_train.model_args.ulysses_size == 1
    assert cfg.reference.model_args.ulysses_size == 1  # 2 in the YAML: a parallel degree, shrunk by the profile
    assert cfg.reference.strategy_args.strategy_name == "fsdp2"  # ROLL's forward-only fsdp2_infer
    assert cfg.actor_infer.generating_args.top_k == 0  # vLLM's -1: off
    training = cfg.actor_train.training_args
    assert training.warmup_for(8) == 2 and training.warmup_for(10) == 3  # ceil(0.25 * steps), as HF
    assert training.model_copy(update={"warmup_steps": 1}).warmup_for(10) == 1  # warmup_steps wins
    assert cfg.train_env_manager.system_envs == {"ENV_WORKER_FLAG": "on"}
    assert set(cfg.custom_envs) == {"Lake"}  # my_games, an env library nobody copied from, is a variable


def test_ulysses_above_one_without_the_profile_is_refused(model_dir):
    with pytest.raises(ConfigError) as info:
        load(model_dir, "plumbing_keys")
    assert str(info.value).startswith("reference.model_args.ulysses_size: 2: Ulysses sequence parallelism")


def test_an_empty_yaml_is_named(model_dir, tmp_path):
    (tmp_path / "empty.yaml").write_text("\n")
    with pytest.raises(ConfigError, match=r"^config_name: .*empty.yaml is empty"):
        load_config(str(tmp_path), "empty", [f"pretrain={model_dir}"])


VL = "roll.pipeline.agentic.env_manager.vl_traj_env_manager.VLTrajEnvManager"


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            ["+custom_env.Lake.pre_step_template=x"],
            "custom_envs.Lake.pre_step_template: is a template of the VL env manager",
        ),
        (
            ["custom_env.Box.env_type=sokoban_sandbox"],
            "custom_envs.Box.env_type: 'sokoban_sandbox' is ROLL's Sokoban "
            "played inside a ROCK sandbox: needs a ROCK sandbox service",
        ),
        (
            ["custom_env.Box.env_type=rock_tb_native_env"],
            "custom_envs.Box.env_type: 'rock_tb_native_env' is ROLL's terminal-bench",
        ),
        (
            ["custom_env.Box.env_type=math:Math12K"],
            "custom_envs.Box.env_type: 'math:Math12K' is a GEM env over a hub dataset",
        ),
        (
            ["+custom_env.Lake.tool_wrapper={wrapper_args: {max_tool_uses: 1}}"],
            "custom_envs.Lake.tool_wrapper: ROLL's GEM tool wrapper wraps GEM env ids only",
        ),
        (
            ["+actor_train.model_args.freeze_module_prefix=vision_model"],
            "actor_train.model_args.freeze_module_prefix: ROLL's partial fine-tuning",
        ),
        (
            [
                "actor_train.strategy_args.strategy_name=fsdp2_train",
                "+actor_train.strategy_args.strategy_config.apply_expert_patch=true",
            ],
            "actor_train.strategy_args.strategy_config.apply_expert_patch: ROLL's fsdp2 patch of MoE expert modules",
        ),
        (["+reward={name: judge}"], "reward: ROLL's reward-model worker"),
        (["+profiler_timeline=true"], "profiler_timeline: ROLL's profiler of a torch-profiler timeline"),
    ],
)
def test_rolls_features_that_cannot_run_here_are_refused_by_name(model_dir, overrides, expected):
    with pytest.raises(ConfigError) as info:
        load(model_dir, "traj_defaults", *HF, *overrides)
    assert str(info.value).startswith(expected) and "\n" not in str(info.value)


def test_the_expert_patch_off_is_no_moe_refusal(model_dir):
    # off passes the refusal pass; roll's fsdp2 then names the option as one it does not have
    with pytest.raises(ConfigError) as info:
        load(
            model_dir,
            "plumbing_keys",
            "reference.model_args.ulysses_size=1",
            "+actor_train.strategy_args.strategy_config.apply_expert_patch=false",
        )
    assert str(info.value).startswith(
        "actor_train.strategy_args.strategy_config.apply_expert_patch: not an option of strategy 'fsdp2'"
    )


def test_an_env_managers_system_envs_reach_its_env_workers():
    from roll.pipeline.setup.rollout_builders import _env_worker_options

    assert _env_worker_options({"ENV_WORKER_FLAG": "on"})["runtime_env"] == {"env_vars": {"ENV_WORKER_FLAG": "on"}}
    assert "runtime_env" not in _env_worker_options({})


def test_rolls_native_step_manager_maps_to_ours(model_dir):
    from roll.pipeline.setup.rollout_builders import env_spec

    cfg = load(model_dir, "native_step")
    assert cfg.train_env_manager.env_manager_type == "step"  # one sample per step
    assert env_spec(cfg, "NativeBox", cfg.train_env_manager).native_chat  # the prompt is the env's chat
    assert cfg.reward_normalization.norm_std_type == "batch"  # with step_reinforce: its returns
    assert cfg.actor_train.strategy_args.strategy_config["bias_activation_fusion"] is True


def test_megatron_fusion_switches_are_booleans(model_dir):
    with pytest.raises(ConfigError) as info:
        load(model_dir, "native_step", "actor_train.strategy_args.strategy_config.apply_rope_fusion=fast")
    assert str(info.value) == (
        "actor_train.strategy_args.strategy_config.apply_rope_fusion: expected true or false (got 'fast')"
    )


def test_a_native_manager_needs_an_env_that_writes_its_chat(model_dir):
    from roll.pipeline.checks.resources import check_envs

    check_envs(load(model_dir, "native_step"))  # sokoban_native_env does
    with pytest.raises(ConfigError) as info:
        check_envs(load(model_dir, "native_step", "custom_envs.NativeBox.env_type=sokoban"))
    assert str(info.value).startswith(
        "custom_envs.NativeBox.env_manager_cls: NativeBox: a native env hands its chat out as info['messages']"
    )
    assert str(info.value).endswith("after reset; 'sokoban' does not (use step or traj)")


def test_rolls_vl_manager_maps_to_ours(model_dir):
    from roll.pipeline.setup.rollout_builders import env_spec

    cfg = load(
        model_dir,
        "traj_defaults",
        *HF,
        f"custom_env.Lake.env_manager_cls={VL}",
        "+custom_env.Lake.pre_step_template='T{turn_idx}'",
        "+actor_infer.strategy_args.strategy_config={limit_mm_per_prompt: {image: 4}}",
    )
    spec = env_spec(cfg, "Lake", cfg.train_env_manager)
    assert cfg.train_env_manager.env_manager_type == "traj"
    assert spec.vision and spec.pre_step_template == "T{turn_idx}" and spec.max_images_per_prompt == 4
    assert not spec.send_frames  # hf takes the processor's pixel values
    cfg.actor_infer.strategy_args.strategy_name = "vllm"  # runs the processor itself: the frames go too
    assert env_spec(cfg, "Lake", cfg.train_env_manager).send_frames


@pytest.mark.parametrize(
    "limit, expected",
    [
        ("{image: -1}", "actor_infer.strategy_args.strategy_config.limit_mm_per_prompt.image: must be an int >= 0"),
        ("{video: 1}", "actor_infer.strategy_args.strategy_config.limit_mm_per_prompt: must be {image: N}"),
    ],
)
def test_a_bad_image_limit_is_named(model_dir, limit, expected):
    with pytest.raises(ConfigError) as info:
        load(
            model_dir,
            "traj_defaults",
            *HF,
            f"+actor_infer.strategy_args.strategy_config={{limit_mm_per_prompt: {limit}}}",
        )
    assert str(info.value).startswith(expected) and "\n" not in str(info.value)
