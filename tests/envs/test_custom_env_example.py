"""examples/custom_env: the user's GuessNumber env passes gymnasium's checker, plays as specified,
and trains through the CLI named by `module:Class`, like any user's env."""

import io
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from examples.custom_env.guess_number import GuessNumberEnv
from roll.agentic.env import resolve_env_class
from roll.agentic.play import play, random_agent, scripted_agent

REPO = Path(__file__).resolve().parents[2]
ENV_TYPE = "examples.custom_env.guess_number:GuessNumberEnv"


def answer(n) -> str:
    return f"<answer>{n}</answer>"


def test_env_type_names_the_class_and_check_env_passes():
    assert resolve_env_class(ENV_TYPE) is GuessNumberEnv
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # an env built from its class has no gymnasium spec, which the render check needs
        check_env(GuessNumberEnv(), skip_render_check=True)


def test_hidden_number_comes_from_the_seed():
    env = GuessNumberEnv()
    for seed in range(5):
        env.reset(seed=seed)
        assert env._target == np.random.default_rng(seed).integers(1, 9)  # gymnasium's seeding


def test_binary_search_transcript():
    env = GuessNumberEnv()
    obs, info = env.reset(seed=0)  # the hidden number is 7
    assert obs == "The number is between 1 and 8."
    assert info["env_instruction"].startswith("Guess the hidden number.")
    steps = [env.step(env.scripted_action()) for _ in range(3)]
    assert [s[:4] for s in steps] == [
        ("4 is too low. The number is between 5 and 8.", 0.0, False, False),
        ("6 is too low. The number is between 7 and 8.", 0.0, False, False),
        ("7 is right!", 1.0, True, False),
    ]
    info = steps[-1][4]
    assert info["success"] is True
    assert info["metrics"] == {"num_actions": 3.0, "num_invalid": 0.0, "guesses": 3.0}
    assert env.scripted_action() is None


def test_too_high_invalid_and_truncation():
    env = GuessNumberEnv(max_guesses=3)
    env.reset(seed=1)  # the hidden number is 4
    first = "8 is too high. The number is between 1 and 7."
    assert env.step(answer(8))[:4] == (first, 0.0, False, False)
    # 9 is not an action of 1..8: an invalid step, nothing changes
    obs, reward, terminated, truncated, info = env.step(answer(9))
    assert (obs, reward, terminated, truncated) == (first, -0.1, False, False)
    assert info["action_is_valid"] is False
    second = "1 is too low. The number is between 2 and 7."
    assert env.step(answer(1))[:4] == (second, 0.0, False, False)
    # the third guess is wrong too: out of guesses
    third = "7 is too high. The number is between 2 and 6."
    assert env.step(answer(7))[:4] == (third, 0.0, False, True)


def test_scripted_agent_always_wins_within_four_guesses_random_does_not():
    env = GuessNumberEnv()
    scripted = play(env, scripted_agent(env), episodes=40, seed=0, out=io.StringIO())
    assert all(s.success and s.steps <= 4 for s in scripted)
    assert {s.steps for s in scripted} == {1, 2, 3, 4}
    random = play(env, random_agent(0), episodes=40, seed=0, out=io.StringIO())
    assert 0 < sum(s.success for s in random) < 40


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from roll.pipeline.tiny_model import main as build

    out = tmp_path_factory.mktemp("m") / "tiny"
    return build(["--env_type", ENV_TYPE, "--output_dir", str(out)])


@pytest.mark.ray
def test_cli_trains_the_custom_env_for_two_steps(tiny_model, tmp_path):
    cmd = [
        sys.executable,
        "examples/start_agentic_pipeline.py",
        "--config_path",
        "custom_env",
        "--config_name",
        "agent_val_guess_number",
        f"pretrain={tiny_model}",
        f"output_dir={tmp_path}",
        "max_steps=2",
        "rollout_batch_size=8",
        "train_env_manager.num_env_groups=2",
        "train_env_manager.group_size=4",
        "val_batch_size=4",
        "val_env_manager.num_env_groups=4",
        "eval_steps=2",
        "actor_train.training_args.per_device_train_batch_size=4",
        "actor_train.training_args.gradient_accumulation_steps=1",
    ]
    # as the run_*.sh script does: `examples.custom_env` importable by the driver and Ray workers
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run(
        cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": pythonpath}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all("train/env/guesses" in r and "losses/policy_loss" in r for r in rows[1:])
    assert "val/success" in rows[0] and "val/success" in rows[2]
