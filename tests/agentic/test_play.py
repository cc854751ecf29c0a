"""Local play: scripted, random and human agents on real envs, and the command line's exits."""

import io
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import envs  # noqa: F401  registers the built-ins (the entry point may not be installed)
from envs.frozen_lake.env import FrozenLakeEnv
from roll.agentic.env import TextEnv, extract_answer
from roll.agentic.play import (
    EpisodeSummary,
    as_answer,
    human_agent,
    main,
    play,
    random_agent,
    scripted_agent,
)

REPO = Path(__file__).resolve().parents[2]


class SayEnv(TextEnv):
    """Open-text actions (`say[word]`, empty `actions`): solved by saying "hello"."""

    instruction = "Say hello, like <answer>say[hello]</answer>."

    def _reset(self, options):
        self._said = ""
        return "say something"

    def parse_action(self, text):
        match = re.fullmatch(r"say\[(\w+)\]", extract_answer(text) or "")
        return match and match.group(1)

    def _apply(self, action):
        self._said = action
        return f"you said {action}", float(self.success), self.success, False

    @property
    def success(self):
        return self._said == "hello"

    def scripted_action(self):
        return "<answer>say[hello]</answer>"


class MuteEnv(SayEnv):
    """SayEnv without a scripted agent."""

    scripted_action = TextEnv.scripted_action


def test_scripted_frozen_lake_episodes_all_succeed():
    env, out = FrozenLakeEnv(), io.StringIO()
    summaries = play(env, scripted_agent(env), episodes=6, seed=10, out=out)
    assert [s.seed for s in summaries] == list(range(10, 16))
    for s in summaries:
        assert (s.success, s.reward, s.invalid_actions, s.end) == (True, 1.0, 0, "terminated")
    text = out.getvalue()
    assert text.count(": success, reward 1 in ") == 6
    assert text.endswith("6/6 episodes succeeded, mean reward 1\n")


def test_scripted_steps_equal_shortest_paths():
    env = FrozenLakeEnv(size=6)
    summaries = play(env, scripted_agent(env), episodes=5, seed=0, out=io.StringIO())
    for s in summaries:
        probe = FrozenLakeEnv(size=6)
        probe.reset(seed=s.seed)
        shortest = probe.step("noise")[4]["metrics"]["shortest_path"]
        assert s.steps == shortest


def test_scripted_agent_needs_the_hook():
    with pytest.raises(ValueError, match="MuteEnv has no scripted agent"):
        scripted_agent(MuteEnv())


def actions_in(text: str) -> list[str]:
    return re.findall(r"--- step \d+: action '(.*)'", text)


def test_random_agent_draws_uniform_actions_from_its_seed():
    outputs = []
    for seed in (5, 5, 6):
        out = io.StringIO()
        play(FrozenLakeEnv(), random_agent(seed), episodes=3, seed=0, max_steps=20, out=out)
        outputs.append(out.getvalue())
    assert outputs[0] == outputs[1] and outputs[0] != outputs[2]
    sent = actions_in(outputs[0])
    rng = np.random.default_rng(5)  # the agent's own generator: one integer per action
    expected = [f"<answer>{FrozenLakeEnv.actions[rng.integers(4)]}</answer>" for _ in sent]
    assert sent == expected and len(sent) > 3


def test_random_agent_mixes_scripted_moves_and_garbage_for_open_text_envs():
    env = SayEnv()
    env.reset(seed=0)
    agent, again = random_agent(3), random_agent(3)
    draws = [agent(env, "") for _ in range(200)]
    assert draws == [again(env, "") for _ in range(200)]
    scripted = draws.count("<answer>say[hello]</answer>")
    assert 70 < scripted < 130  # a fair coin: 100 expected, sd 7
    garbage = [d for d in draws if d != "<answer>say[hello]</answer>"]
    assert all(env.parse_action(d) is None for d in garbage)
    tagged = sum(d.startswith("<answer>") for d in garbage)
    assert 0 < tagged < len(garbage)  # half inside <answer> tags, half bare


@pytest.mark.parametrize(
    ("typed", "sent"),
    [
        ("Left", "<answer>Left</answer>"),
        (" search[red shoes] \n", "<answer>search[red shoes]</answer>"),
        ("<answer>Up</answer>", "<answer>Up</answer>"),
        ("<think>hm</think> Up", "<think>hm</think> Up"),
    ],
)
def test_as_answer(typed, sent):
    assert as_answer(typed) == sent


def test_human_agent_plays_from_stdin():
    # seed 1 is this map: the player 3 moves above the goal, straight down
    stdin, out = io.StringIO("Down\nbogus\n<answer>Down</answer>\ndown\n"), io.StringIO()
    env = FrozenLakeEnv()
    [summary] = play(env, human_agent(stdin, out), episodes=1, seed=1, out=out)
    text = out.getvalue()
    assert "observation:\n__P_\n____\n_O__\n__G_\n" in text
    assert actions_in(text) == [
        "<answer>Down</answer>",
        "<answer>bogus</answer>",
        "<answer>Down</answer>",
        "<answer>down</answer>",
    ]
    assert summary == EpisodeSummary(1, 4, pytest.approx(0.9), True, 1, "terminated")
    assert text.count("action> ") == 4


@pytest.mark.parametrize("stdin", ["Left\nq\nUp\n", "Left\n"])  # q, or the end of input
def test_human_quits_the_whole_run(stdin):
    out = io.StringIO()
    summaries = play(FrozenLakeEnv(), human_agent(io.StringIO(stdin), out), episodes=3, out=out)
    assert [(s.steps, s.end) for s in summaries] == [(1, "quit")]
    assert out.getvalue().endswith("0/1 episodes succeeded, mean reward 0\n")


def test_max_steps_ends_an_episode():
    out = io.StringIO()
    [summary] = play(SayEnv(), random_agent(0), max_steps=2, out=out)
    assert summary.end in ("max_steps", "terminated") and summary.steps <= 2
    [summary] = play(MuteEnv(), random_agent(0), max_steps=4, out=out)
    assert (summary.steps, summary.end, summary.invalid_actions) == (4, "max_steps", 4)


def test_cli_scripted_frozen_lake():
    cmd = [sys.executable, "-m", "roll.agentic.play", "--env", "frozen_lake", "--agent", "scripted", "--episodes", "2"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "success" in proc.stdout and "2/2 episodes succeeded" in proc.stdout


def test_cli_unknown_env_is_one_line_exit_2():
    cmd = [sys.executable, "-m", "roll.agentic.play", "--env", "no_such_env"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    prefix = "python -m roll.agentic.play: error: unknown env_type 'no_such_env'"
    assert proc.stderr.startswith(prefix)
    assert proc.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["frozen_lake", "--env_config", "{size: 3}"], "--env_config is not valid JSON: Expecting property name"),
        (["frozen_lake", "--env_config", "[3]"], "--env_config must be a JSON object, got '[3]'"),
        (["frozen_lake", "--env_config", '{"sise": 3}'], "unknown env_config key(s) 'sise'"),
        (["frozen_lake", "--env_config", '{"size": 1}'], "size must be in [2, 64]"),
        ([f"{__name__}:MuteEnv", "--agent", "scripted"], "MuteEnv has no scripted agent"),
    ],
)
def test_cli_bad_arguments_are_one_line_exit_2(args, message, capsys):
    assert main(["--env", *args], stdin=io.StringIO(), out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_cli_in_process_plays_with_a_json_config():
    out = io.StringIO()
    argv = [
        "--env",
        "roll/FrozenLake-v0",
        "--agent",
        "scripted",
        "--seed",
        "4",
        "--episodes",
        "3",
        "--env_config",
        '{"size": 5, "hole_prob": 0.3}',
    ]
    assert main(argv, stdin=io.StringIO(), out=out) == 0
    assert out.getvalue().endswith("3/3 episodes succeeded, mean reward 1\n")
    assert "=== episode 3/3 (seed 6) ===\n" in out.getvalue()
    assert re.search(r"observation:\n(?:[_OGP√]{5}\n){5}", out.getvalue())  # size 5 maps
