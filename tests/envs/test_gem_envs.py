"""GEM envs (gem-llm) behind the TextEnv API: real games and reasoning-gym tasks solved by rule,
seeds that reproduce whatever else draws from the global generators, dataset ids refused by name,
GEM's python tool running in roll's sandbox, and ROLL's GEM config keys accepted."""

from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gem", reason="gem-llm is not installed (bash scripts/install_gem.sh)")

import envs  # noqa: E402, F401  registers the built-ins and the GEM id namespaces
from roll.agentic.env import make_env  # noqa: E402
from roll.agentic.templates import step_prompt_text  # noqa: E402

GUESS = ("game:GuessTheNumber-v0", {"min_number": 1, "max_number": 20, "max_turns": 20})
TOOL = {
    "wrapper_args": {"tool_reward": 0, "tool_success_reward": 0, "max_tool_uses": 2},
    "tool_configs": [{"tool_id": "python_code", "tool_args": {"timeout": 5, "sandbox_type": "none"}}],
}


def binary_search(env, seed: int) -> list[tuple]:
    """Play GuessTheNumber by halving the range GEM's hints leave; the transitions."""
    env.reset(seed=seed)
    low, high, steps = 1, 20, []
    while True:
        guess = (low + high) // 2
        step = env.step(f"I guess \\boxed{{{guess}}}")
        steps.append(step[:4])
        if step[2] or step[3]:
            return steps
        if "lower" in step[0]:
            high = guess - 1
        else:
            low = guess + 1


def test_guess_the_number_is_won_by_binary_search_and_seeds_reproduce():
    env = make_env(*GUESS)
    for seed in range(5):
        steps = binary_search(env, seed)
        assert steps[-1][1] == 1.0 and steps[-1][2] and len(steps) <= 5  # log2(20) < 5
        assert env.success and "Congratulations" in steps[-1][0]
    other = make_env(*GUESS)
    first = binary_search(env, 11)
    random.seed(123)
    np.random.seed(123)  # the process-global generators GEM uses: envs must not share them
    other.reset(seed=99)
    random.random()
    assert binary_search(env, 11) == first
    assert any(binary_search(env, s) != first for s in (12, 13, 14))


def test_a_malformed_answer_keeps_gems_meaning():
    env = make_env(*GUESS)
    env.reset(seed=0)
    obs, reward, terminated, _, info = env.step("twelve")
    assert terminated and reward < 0 and "did not provide a valid guess" in obs
    assert info["action_is_valid"] is True and not info["success"]


def test_letter_counting_rewards_the_right_count():
    env = make_env("rg:letter_counting", {"size": 20, "seed": 42})
    for seed in range(3):
        question, _ = env.reset(seed=seed)
        letter, text = re.search(r'letter "(.)" appear in the text: "(.*)"', question).groups()
        _, reward, terminated, _, info = env.step(f"\\boxed{{{text.count(letter)}}}")
        assert reward == 1.0 and terminated and info["success"]
        env.reset(seed=seed)
        assert env.step(f"\\boxed{{{text.count(letter) + 1}}}")[1] == 0.0


@pytest.mark.parametrize("env_id", ["math:Math12K", "logic:RuleTaker-d0", "qa:HotpotQA"])
def test_a_gem_env_over_a_hub_dataset_is_refused_by_name(env_id):
    with pytest.raises(ValueError, match=f"{re.escape(env_id)}.*hub dataset"):
        make_env(env_id, {})


def test_an_unknown_gem_id_is_refused_by_name():
    with pytest.raises(ValueError, match="'game:NoSuchGame-v0' is not a GEM env id"):
        make_env("game:NoSuchGame-v0", {})


def test_gems_python_tool_runs_in_the_sandbox_and_escapes_are_counted():
    env = make_env("rg:basic_arithmetic", {"size": 10, "seed": 1, "tool_wrapper": TOOL})
    obs, _ = env.reset(seed=0)
    assert "<python>...</python>" in obs  # GEM's tool instructions follow the question
    obs, reward, terminated, _, info = env.step("<python>print(6 * 7)</python>")
    assert obs.startswith("Code execution result: 42") and not terminated and reward == 0.0
    obs, _, _, _, info = env.step("<python>open('/etc/roll_gem_escape', 'w')</python>")
    assert "Read-only file system" in obs or "Permission denied" in obs
    assert "[sandbox: write_outside]" in obs
    assert info["metrics"]["sandbox_commands"] == 2.0 and info["metrics"]["sandbox_violations"] == 1.0
    assert not Path("/etc/roll_gem_escape").exists()
    # out of tool uses: the next answer goes to the env, which grades it and ends the episode
    assert env.step("\\boxed{0}")[2]


@pytest.mark.parametrize(
    "block, match",
    [
        ({"tool_configs": [{"tool_id": "search", "tool_args": {}}]}, "tool_id 'search' is not supported"),
        ({"wrapper_args": {"max_uses": 1}, "tool_configs": TOOL["tool_configs"]}, "max_uses"),
        ({"tool_configs": [{"tool_id": "python_code", "tool_args": {"memory": 1}}]}, "memory"),
    ],
)
def test_tool_wrapper_keys_we_do_not_run_are_refused_by_name(block, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make_env("rg:basic_arithmetic", {"tool_wrapper": block})


def test_step_concat_history_is_the_earlier_observations_one_per_line():
    text = step_prompt_text(
        "H:\n{history}\nNow: {current_observation}",
        env_instruction="ignored",
        history=[("obs one", "a1", 0.0), ("obs two", "a2", 1.0)],
        step=2,
        observation="obs three",
        max_response_length=8,
        concat=True,
    )
    assert text == "H:\nobs one\nobs two\nNow: obs three"
    with pytest.raises(ValueError, match="step_count"):  # ROLL's concat manager fills only these two
        step_prompt_text(
            "{step_count}", env_instruction="", history=[], step=0, observation="", max_response_length=1, concat=True
        )


def test_rolls_gem_config_keys_are_accepted(tmp_path, monkeypatch):
    from roll.configs import load_config
    from roll.models.tiny import build_tiny_model
    from roll.pipeline.setup.rollout_builders import env_spec

    model = build_tiny_model(str(tmp_path / "m"), corpus=["Guess."], seed=0)
    monkeypatch.chdir(tmp_path)
    runs = Path(__file__).resolve().parents[1] / "configs" / "roll_dialect" / "runs"
    cfg = load_config(
        str(runs), "gem_step_concat", [f"pretrain={model}", f"reward_pretrain={model}", "+profile=cpu_smoke"]
    )
    assert cfg.train_env_manager.env_manager_type == "step"
    guess, counting = env_spec(cfg, "GuessTheNumber"), env_spec(cfg, "Counting")
    assert guess.concat_history and guess.env_type == "game:GuessTheNumber-v0" and guess.history_length == 4
    assert counting.env_config["tool_wrapper"]["tool_configs"][0]["tool_id"] == "python_code"
    env = make_env(counting.env_type, counting.env_config)
    assert env.reset(seed=0)[0]


@pytest.mark.ray
def test_a_gem_config_in_rolls_dialect_trains_one_step(tmp_path):
    import json
    import os
    import subprocess
    import sys

    from roll.models.tiny import build_tiny_model

    repo = Path(__file__).resolve().parents[2]
    model = build_tiny_model(str(tmp_path / "m"), corpus=["Guess the number", "letter"], seed=0)
    cmd = [
        sys.executable,
        "examples/start_agentic_pipeline.py",
        "--config_path",
        str(repo / "tests" / "configs" / "roll_dialect" / "runs"),
        "--config_name",
        "gem_step_concat",
        "+profile=cpu_smoke",
        f"pretrain={model}",
        f"reward_pretrain={model}",
        f"output_dir={tmp_path / 'out'}",
        f"logging_dir={tmp_path / 'logs'}",
    ]
    pythonpath = os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run(
        cmd, cwd=repo, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": pythonpath}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 1 and "losses/policy_loss" in rows[-1]
    assert "train/env/sandbox_commands" in rows[-1]  # the Counting tag's python tool is wired
