"""Pre-start checks (roll/pipeline/checks/resources.py) through the CLI, as a user meets them: each bad
setup is one line naming the key and exit 2, before the pipeline (Ray, models) is touched."""

from __future__ import annotations

import os
import shutil
import sys
import time

import pytest

from envs.frozen_lake.env import FrozenLakeEnv
from envs.sokoban.env import SokobanEnv
from roll.cli import main

CONFIG_DIR = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(autouse=True)
def no_pipeline(monkeypatch):
    monkeypatch.setitem(sys.modules, "roll.pipeline.agentic_pipeline", None)


def run(capsys, model_dir, *overrides):
    """(exit status, stderr lines); a run that passes every check reaches the (blocked) pipeline."""
    try:
        status = main(
            ["--config_path", CONFIG_DIR, "--config_name", "minimal_agentic", f"pretrain={model_dir}", *overrides]
        )
    except ImportError as err:
        assert "roll.pipeline.agentic_pipeline" in str(err)
        status = "started"
    return status, capsys.readouterr().err.splitlines()


def test_a_fresh_run_refuses_another_runs_output_dir(tmp_path, model_dir, capsys):
    out = tmp_path / "run"
    (out / "checkpoints" / "step_3").mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    assert run(capsys, model_dir, f"output_dir={out}") == (
        2,
        [
            f"config error: output_dir: {out} holds another run's metrics.jsonl and checkpoints (step_3); "
            "resume it with resume_from_checkpoint=true, choose another output_dir, or set "
            "overwrite_output_dir=true to delete them"
        ],
    )
    assert (out / "metrics.jsonl").exists()  # nothing was touched
    assert run(capsys, model_dir, f"output_dir={out}", "resume_from_checkpoint=true")[0] == "started"
    assert run(capsys, model_dir, f"output_dir={out}", "overwrite_output_dir=true")[0] == "started"
    assert not (out / "metrics.jsonl").exists() and not (out / "checkpoints").exists()
    assert run(capsys, model_dir, f"output_dir={out}")[0] == "started"  # an empty dir is fine


@pytest.mark.parametrize("key", ["output_dir", "logging_dir"])
def test_an_unwritable_directory_is_named(tmp_path, model_dir, capsys, key):
    (tmp_path / "a_file").write_text("")
    status, lines = run(capsys, model_dir, f"{key}={tmp_path / 'a_file' / 'sub'}")
    assert status == 2 and lines == [
        f"config error: {key}: cannot write to {tmp_path / 'a_file' / 'sub'}: Not a directory"
    ]


def test_a_broken_model_config_is_named(tmp_path, model_dir, capsys):
    broken = tmp_path / "model"
    shutil.copytree(model_dir, broken)
    (broken / "config.json").write_text('{"model_type": "llama", "hidden_size": ')  # cut short
    status, lines = run(capsys, broken, f"output_dir={tmp_path / 'run'}")
    assert status == 2 and len(lines) == 1
    assert lines[0].startswith(f"config error: pretrain: {broken}/config.json cannot be loaded: ")


def test_sequence_length_must_hold_the_first_prompt_and_a_response(tmp_path, model_dir, capsys):
    status, lines = run(capsys, model_dir, f"output_dir={tmp_path / 'run'}", "sequence_length=30")
    assert status == 2 and len(lines) == 1
    assert lines[0].startswith("config error: sequence_length: 30 cannot hold SimpleFrozenLake's first prompt (")
    assert lines[0].endswith(
        "and one response (custom_envs.SimpleFrozenLake.max_tokens_per_step=8); use at least "
        + lines[0].rsplit(" ", 1)[1]
    )


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("size=0", "size must be in [2, 64]"),
        ("size=100000", "size must be in [2, 64]"),
        ("size=3000", "size must be in [2, 64]"),
        ("hole_prob=2.0", "hole_prob must be a number in [0, 1], got 2.0"),
        ("size=four", "size must be an int, got 'four'"),
    ],
)
def test_bad_env_config_values_are_named_before_start(tmp_path, model_dir, capsys, value, says):
    started = time.monotonic()
    status, lines = run(
        capsys, model_dir, f"output_dir={tmp_path / 'run'}", f"custom_envs.SimpleFrozenLake.env_config.{value}"
    )
    assert status == 2 and len(lines) == 1 and time.monotonic() - started < 20
    assert lines[0].startswith("config error: custom_envs.SimpleFrozenLake.env_config: ") and says in lines[0]


def test_an_env_that_hangs_while_built_is_named_after_the_time_bound(tmp_path, model_dir, capsys, monkeypatch):
    monkeypatch.setenv("ROLL_ENV_CHECK_TIMEOUT_S", "0.5")
    monkeypatch.setattr(FrozenLakeEnv, "_reset", lambda self, options: time.sleep(3))
    status, lines = run(capsys, model_dir, f"output_dir={tmp_path / 'run'}")
    assert (status, lines) == (
        2,
        [
            "config error: custom_envs.SimpleFrozenLake.env_config: building and resetting "
            "one envs.frozen_lake.env:FrozenLakeEnv env took over 0.5s; check its sizes"
        ],
    )


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda: SokobanEnv(dim_room=[1000, 1000]), "dim_room sides must be at most 30"),
        (lambda: SokobanEnv(search_depth=10**9), "search_depth must be in [1, 1000]"),
        (lambda: FrozenLakeEnv().reset(seed=1.5), "seed must be a non-negative int or None, got 1.5"),
        (lambda: FrozenLakeEnv().reset(seed="7"), "seed must be a non-negative int or None, got '7'"),
    ],
)
def test_envs_refuse_their_own_bad_values_at_once(make, says):
    started = time.monotonic()
    with pytest.raises(ValueError, match=None) as err:
        make()
    assert says in str(err.value) and time.monotonic() - started < 1
