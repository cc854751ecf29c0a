"""The command line as a user runs it: a bad config exits 2 with one stderr line, no traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from roll.cli import main
from roll.configs.command_line import resolve_config_dir

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO_ROOT, "examples", "start_agentic_pipeline.py")
CONFIG_DIR = os.path.join(REPO_ROOT, "tests", "configs")
BAD_KEY_LINE = "config error: actor_train.training_args.lerning_rate: unknown key (did you mean 'learning_rate'?)"


def run_script(cwd, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": REPO_ROOT}
    return subprocess.run(
        [sys.executable, SCRIPT, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_script_rejects_an_unknown_override_key_in_one_line(model_dir):
    # config_path relative to the current directory (the repository root)
    result = run_script(
        REPO_ROOT,
        "--config_path", "tests/configs",
        "--config_name", "minimal_agentic",
        f"pretrain={model_dir}",
        "actor_train.training_args.lerning_rate=0.1",
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.splitlines() == [BAD_KEY_LINE]
    assert "Traceback" not in result.stderr + result.stdout


def test_script_finds_config_path_relative_to_examples(model_dir, tmp_path):
    # From elsewhere, "../tests/configs" only exists relative to examples/.
    result = run_script(
        str(tmp_path),
        "--config_path", os.path.join("..", "tests", "configs"),
        "--config_name", "minimal_agentic",
        f"pretrain={model_dir}",
        "+actor_train.training_args.lerning_rate=0.1",
    )  # fmt: skip
    assert (result.returncode, result.stderr.splitlines()) == (2, [BAD_KEY_LINE])


def test_missing_config_dir_is_a_config_error(tmp_path, capsys):
    examples = tmp_path / "examples"
    examples.mkdir()
    status = main(["--config_path", "no_such_dir", "--config_name", "x"], examples_dir=str(examples))
    looked_in = f"{os.path.abspath('no_such_dir')}, {examples / 'no_such_dir'}"
    assert status == 2
    assert capsys.readouterr().err == (
        f"config error: config_path: no directory 'no_such_dir' (looked in: {looked_in})\n"
    )


def test_resolve_config_dir_prefers_the_current_directory(tmp_path, monkeypatch):
    examples = tmp_path / "examples"
    (examples / "exp").mkdir(parents=True)
    (examples / "both").mkdir()
    (tmp_path / "cwd" / "both").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "cwd")
    assert resolve_config_dir("exp", str(examples)) == str(examples / "exp")
    assert resolve_config_dir("both", str(examples)) == str(tmp_path / "cwd" / "both")
    assert resolve_config_dir(str(examples / "exp"), None) == str(examples / "exp")


def test_main_reports_missing_config_name(capsys):
    status = main(["--config_path", CONFIG_DIR, "--config_name", "nope"])
    assert status == 2
    assert capsys.readouterr().err == f"config error: config_name: no 'nope' config in {CONFIG_DIR}\n"


@pytest.mark.parametrize(
    ("error", "line"),
    [
        ("rollout", "training stopped: rollout: too many failed groups; last causes: ['x']"),
        ("engine", "training stopped: inference engine 'vllm' failed: RuntimeError: CPU Generator does not use offset"),
        (
            "worker",
            "training stopped: a worker process died (unknown): it was killed without a word, as kill -9 kills; "
            "resume from the last checkpoint (none) with resume_from_checkpoint=true",
        ),
    ],
)
def test_a_run_that_cannot_go_on_stops_with_one_line_and_exit_1(error, line, model_dir, monkeypatch, capsys):
    from ray.exceptions import ActorDiedError

    from roll.agentic.rollout.scheduler import RolloutFailed
    from roll.core.errors import EngineFailed
    from roll.pipeline import agentic_pipeline

    class Failing:
        def __init__(self, config):
            pass

        def run(self):
            if error == "rollout":
                raise RolloutFailed("rollout: too many failed groups; last causes: ['x']")
            if error == "engine":
                raise EngineFailed("inference engine 'vllm' failed: RuntimeError: CPU Generator does not use offset")
            raise ActorDiedError()

    monkeypatch.setattr(agentic_pipeline, "AgenticPipeline", Failing)
    status = main(["--config_path", CONFIG_DIR, "--config_name", "minimal_agentic", f"pretrain={model_dir}"])
    assert status == 1
    assert capsys.readouterr().err.splitlines() == [line]


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stop_signal_ends_the_run_with_one_line(signum, status, model_dir, monkeypatch, capsys):
    from roll.pipeline import agentic_pipeline

    class Interrupted:
        def __init__(self, config):
            pass

        def run(self):
            os.kill(os.getpid(), signum)
            time.sleep(30)  # the handler raises here
            raise AssertionError("the signal did not stop the run")

    monkeypatch.setattr(agentic_pipeline, "AgenticPipeline", Interrupted)
    before = signal.getsignal(signal.SIGINT)
    got = main(["--config_path", CONFIG_DIR, "--config_name", "minimal_agentic", f"pretrain={model_dir}"])
    assert got == status
    name = signal.Signals(signum).name
    assert capsys.readouterr().err.splitlines() == [
        f"training stopped: {name}; resume from the last checkpoint with resume_from_checkpoint=true"
    ]
    assert signal.getsignal(signal.SIGINT) is before  # the CLI's handlers are gone again
