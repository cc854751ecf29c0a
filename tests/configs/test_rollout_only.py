"""ROLL's rollout-only pipeline and rollout keys (roll.configs.rollout, roll.pipeline.rollout_pipeline,
roll.pipeline.phases.recorded_rollout) on YAMLs of our own in ROLL's dialect."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from roll.configs import ConfigError, load_config
from roll.configs.roll_compat.dialect import ENV_LIBRARY_VARIABLES
from roll.configs.rollout import unused_in_rollout

HERE = Path(__file__).parent / "roll_dialect" / "runs"
REPO = Path(__file__).parents[2]


def load(model_dir, name, *overrides):
    return load_config(str(HERE), name, [f"pretrain={model_dir}", *overrides])


def test_a_config_without_actor_train_is_a_rollout_only_run(model_dir):
    cfg = load(model_dir, "rollout_only", "+profile=cpu_smoke")
    assert cfg.rollout_only and cfg.actor_train is None
    assert list(cfg.built_roles) == ["actor_infer"]  # no trainer, reference or critic is built
    assert cfg.device_layout["mappings"] == {"actor_infer": None}
    assert cfg.rpc_timeout == 600 and cfg.rollout_dump_dir == "./output/rollout_dump"
    # what ROLL's rollout pipeline ignores is named, the env library's variables are not
    assert unused_in_rollout(set(cfg.model_fields_set), set(ENV_LIBRARY_VARIABLES)) == ["save_steps"]


def test_rolls_rollout_script_leaves_the_training_roles_out(model_dir, capsys):
    # ROLL's rollout configs give actor_train a model_args only: no strategy_args, not a valid role
    cfg = load_config(
        str(HERE),
        "traj_defaults",
        [f"pretrain={model_dir}", f"reward_pretrain={model_dir}", "~actor_train.strategy_args", "+profile=cpu_smoke"],
        rollout_only=True,
    )
    assert cfg.rollout_only and cfg.reference is None and list(cfg.built_roles) == ["actor_infer"]
    assert "rollout-only run: actor_train, reference not used" in capsys.readouterr().err


def test_training_configs_are_not_rollout_only(model_dir):
    cfg = load(model_dir, "traj_defaults", "+profile=cpu_smoke", f"reward_pretrain={model_dir}")
    assert not cfg.rollout_only and "actor_train" in cfg.built_roles


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            ["+profiler_memory=true"],
            "profiler_memory: ROLL's profiler of CUDA memory snapshots; roll has no such profiler",
        ),
        (["rpc_timeout=0"], "rpc_timeout: input should be greater than 0"),
        (["+rollout_mock.mode=replay"], "rollout_mock.mode: input should be 'dump' or 'mock'"),
        (["+rollout_mock.dump_to=x"], "rollout_mock.dump_to: unknown key (did you mean 'dump_dir'?)"),
    ],
)
def test_bad_rollout_keys_are_one_line_errors(model_dir, overrides, expected):
    with pytest.raises(ConfigError) as info:
        load(model_dir, "rollout_only", "+profile=cpu_smoke", *overrides)
    assert str(info.value).startswith(expected) and "\n" not in str(info.value)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from roll.pipeline.tiny_model import main as build

    return build(["--preset", "frozen_lake", "--output_dir", str(tmp_path_factory.mktemp("m") / "tiny")])


def _run(script, name, tmp_path, *args):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [
            sys.executable,
            f"examples/{script}",
            "--config_path",
            str(HERE),
            "--config_name",
            name,
            "+profile=cpu_smoke",
            *args,
            f"output_dir={tmp_path}/out",
            f"logging_dir={tmp_path}/logs",
            f"tracker_kwargs.log_dir={tmp_path}/tb",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def _metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.ray
def test_rollout_only_run_writes_metrics_tensorboard_and_dumps(tiny_model, tmp_path):
    proc = _run(
        "start_agentic_pipeline.py",
        "rollout_only",
        tmp_path,
        f"pretrain={tiny_model}",
        f"rollout_dump_dir={tmp_path}/dump",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "rollout-only run (no actor_train): these keys are not used: save_steps" in proc.stderr
    rows = _metrics(tmp_path / "out" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert [r["system/samples"] for r in rows] == [4.0, 8.0]  # 2 groups of 2 per step (cpu_smoke)
    for r in rows:
        assert r["val/score/min"] <= r["val/score/mean"] <= r["val/score/max"]
        assert r["val/score/mean"] == pytest.approx(r["val/episode_reward"])
        assert {"val/Lake/score/mean", "val/Box/score/mean", "time/step_s"} <= set(r)
        assert not any(k.startswith(("losses/", "actor/")) for k in r)  # nothing trained
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    for step, r in zip((1, 2), rows):
        dumped = [json.loads(line) for line in (tmp_path / "dump" / f"rollout_dump_data.step_{step}.jsonl").open()]
        assert len(dumped) == 4 and {d["tag"] for d in dumped} == {"Lake", "Box"}
        assert sum(d["episode_reward"] for d in dumped) / 4 == pytest.approx(r["val/episode_reward"])
    roles = {p["role"] for p in json.loads((tmp_path / "out" / "placement.json").read_text())["processes"]}
    assert roles == {"actor_infer", "env_worker:train"}
    assert not (tmp_path / "out" / "checkpoints").exists()


@pytest.mark.ray
def test_rolls_rollout_script_runs_a_training_config_without_training(tiny_model, tmp_path):
    proc = _run(
        "start_agentic_rollout_pipeline.py",
        "traj_defaults",
        tmp_path,
        f"pretrain={tiny_model}",
        f"reward_pretrain={tiny_model}",
        "max_steps=1",
        "actor_train.strategy_args.strategy_name=torch_train",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "rollout-only run: actor_train, reference not used" in proc.stderr  # left out before validation
    unused = next(line for line in proc.stderr.splitlines() if "these keys are not used" in line)
    assert "eval_steps" in unused and "val_env_manager" in unused
    rows = _metrics(tmp_path / "out" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1] and "val/score/mean" in rows[0]
