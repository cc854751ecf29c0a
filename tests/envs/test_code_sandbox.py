"""The sandboxed coding env: the expert solves every shipped task, rewards are shares of hidden
tests, escape attempts end the episode with their reason, and nothing outlives an episode."""

from __future__ import annotations

import os

import pytest

import envs  # noqa: F401  registers the built-ins
from envs.code_sandbox import TASKS, CodeSandboxEnv
from envs.code_sandbox.grader import grade, parse_test
from envs.code_sandbox.tasks import TASKS_BY_NAME
from roll.agentic.env import make_env
from roll.agentic.sandbox import Sandbox
from roll.agentic.sandbox.isolation import choose_mode, seccomp_available

NAMESPACES = choose_mode("auto") == "namespaces"


def play_expert(env: CodeSandboxEnv, seed: int) -> tuple[float, dict]:
    env.reset(seed=seed)
    for _ in range(env.max_steps):
        _, reward, terminated, truncated, info = env.step(env.scripted_action())
        if terminated or truncated:
            return reward, info
    raise AssertionError("the expert did not finish")


def submit(env: CodeSandboxEnv, task: str, code: str | None = None) -> tuple[float, dict]:
    env.reset(seed=0, options={})
    assert env.task.name == task
    if code is not None:
        env.step(f"<write>{code}</write>")
    _, reward, terminated, _, info = env.step("<answer>submit</answer>")
    assert terminated
    return reward, info


@pytest.mark.parametrize("task", [t.name for t in TASKS])
def test_the_expert_solves_every_task_and_the_starter_does_not(task):
    env = CodeSandboxEnv(tasks=[task])
    reward, info = play_expert(env, seed=0)
    assert reward == 1.0 and info["success"] and info["end_reason"] == "submitted"
    assert info["metrics"]["tests_passed"] == 1.0
    starter_reward, info = submit(env, task)
    assert starter_reward < 1.0 and not info["success"]
    env.close()


def test_reward_is_the_share_of_hidden_tests_passed():
    env = CodeSandboxEnv(tasks=["fizzbuzz"])
    assert submit(env, "fizzbuzz")[0] == 0.75  # the starter misses only 30 -> 'FizzBuzz'
    env = CodeSandboxEnv(tasks=["sum_digits"])
    assert submit(env, "sum_digits")[0] == pytest.approx(2 / 3)  # int('-') fails on -45
    env = CodeSandboxEnv(tasks=["add"])
    assert submit(env, "add", "```python\ndef add(a, b):\n    return a + b\n```")[0] == 1.0


@pytest.mark.parametrize(
    "cheat",
    [
        "import sys\nsys.exit(0)\n",
        "print('[true, true, true]')\nimport os\nos._exit(0)\n",
        "def add(a, b):\n    while True:\n        pass\n",
        # the grader's own marker line, read from the grading process it runs in
        "import __main__, json, os\nprint(__main__.MARK + json.dumps(['True'] * 3), flush=True)\nos._exit(0)\n",
        # a value equal to everything
        "class Equal:\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return Equal()\n",
        # an int equal to everything
        "class Equal(int):\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return Equal(7)\n",
    ],
)
def test_a_solution_cannot_fake_its_grade(cheat):
    env = CodeSandboxEnv(tasks=["add"], sandbox={"wall_s": 8})
    assert submit(env, "add", cheat)[0] == 0.0


def test_a_planted_stdlib_module_is_not_what_the_grader_imports():
    """The runner imports json and signal: a json.py in the workspace stays unread."""
    task = TASKS_BY_NAME["add"]
    with Sandbox({"wall_s": 8}) as box:
        box.write_file("solution.py", task.solution)
        box.write_file("json.py", "open('shadow_ran', 'w').close()\ndef dumps(x):\n    return '[true, true, true]'\n")
        assert grade(box, task.tests) == [True, True, True]
        assert box.read_file("shadow_ran") is None
        box.write_file("solution.py", task.starter)
        assert grade(box, task.tests) == [False, False, False]


def test_hidden_tests_compare_a_call_with_a_literal():
    assert parse_test("assert solution.add(1, 2) == 3") == ("solution.add(1, 2)", "==", 3)
    assert parse_test("assert solution.is_even(0) is True") == ("solution.is_even(0)", "is", True)
    for bad in (
        "assert solution.add(1, 2) == 1 + 2",
        "assert add(1, 2) == 3",
        "solution.add(1, 2)",
        "assert solution.f() is 3",
    ):
        with pytest.raises(ValueError, match="hidden test"):
            parse_test(bad)


def test_shell_and_python_run_in_the_workspace_and_it_is_gone_after_the_episode():
    env = CodeSandboxEnv(tasks=["add"])
    env.reset(seed=1)
    workspace = env._sandbox.workspace
    obs, reward, *_ = env.step("<bash>cat solution.py; pwd</bash>")
    assert "raise NotImplementedError" in obs and "/workspace" in obs and workspace not in obs
    assert obs.endswith("[exit 0]") and reward == 0.0
    obs, *_ = env.step("<python>import solution; print(solution.add.__name__)</python>")
    assert "add" in obs
    obs, _, _, truncated, info = env.step("<bash>cat > solution.py <<'E'\ndef add(a, b):\n    return a + b\nE</bash>")
    assert not truncated
    obs, reward, terminated, _, info = env.step("<answer>submit</answer>")
    assert reward == 1.0 and terminated
    assert not os.path.exists(workspace)


@pytest.mark.parametrize(
    "command, reason",
    [
        ("<bash>sleep 100000</bash>", "wall_time"),
        ("<bash>echo pwned > /etc/roll_code_env_escape</bash>", "write_outside"),
        ("<bash>yes</bash>", "output"),
        ("<bash>bomb() { bomb | bomb & }; bomb; sleep 1</bash>", "processes"),
        # as root the parent is out of reach (another uid); without root the command may kill its
        # launcher, which is caught and named
        ("<bash>kill -9 $PPID; echo survived</bash>", "signal_denied" if os.geteuid() == 0 else "parent_killed"),
        pytest.param(
            "<python>import socket; socket.create_connection(('127.0.0.1', 9), timeout=2)</python>",
            "network",
            marks=pytest.mark.skipif(
                not NAMESPACES and seccomp_available() is not None,
                reason="the network is open without namespaces or the seccomp filter (reported)",
            ),
        ),
    ],
)
def test_an_escape_attempt_ends_the_episode_with_its_reason_and_the_run_goes_on(command, reason):
    env = CodeSandboxEnv(tasks=["add"], sandbox={"wall_s": 3, "max_procs": 8}, violation_penalty=-1.0)
    env.reset(seed=0)
    workspace = env._sandbox.workspace
    obs, reward, terminated, truncated, info = env.step(command)
    assert terminated and not truncated and reward == -1.0
    assert info["end_reason"] == f"sandbox violation: {reason}"
    assert info["sandbox"]["violations"] == {reason: 1} and info["metrics"]["violations"] == 1.0
    assert f"[stopped: {reason}]" in obs or reason in ("write_outside", "processes")
    assert not os.path.exists(workspace) and not os.path.exists("/etc/roll_code_env_escape")
    assert play_expert(env, seed=0)[0] == 1.0  # the next episode runs as usual


def test_actions_parse_by_tool_and_other_text_is_invalid():
    env = CodeSandboxEnv()
    assert env.parse_action("think first <bash> ls </bash> <python>1</python>") == "bash\nls"
    assert env.parse_action("<ANSWER> Submit </answer>") == "answer\nsubmit"
    assert env.parse_action("<bash>ls -a") == "bash\nls -a"  # cut off at the token limit
    assert env.parse_action("<write>\n```py\nx = 1\n```\n</write>") == "write\nx = 1"
    for text in ("<answer>Left</answer>", "<bash></bash>", "ls", "<shell>ls</shell>"):
        assert env.parse_action(text) is None
    env.reset(seed=3)
    obs, reward, terminated, _, info = env.step("no tool here")
    assert not info["action_is_valid"] and reward == env.format_penalty and not terminated
    env.close()


def test_unknown_tasks_and_sandbox_keys_are_refused_by_name():
    with pytest.raises(ValueError, match="nope"):
        CodeSandboxEnv(tasks=["nope"])
    with pytest.raises(TypeError, match="wal_s"):
        make_env("code_sandbox", {"sandbox": {"wal_s": 1}})


def test_max_steps_grades_what_is_there():
    env = CodeSandboxEnv(tasks=["is_even"], max_steps=2)
    env.reset(seed=0)
    env.step(f"<write>{env.task.solution}</write>")
    _, reward, terminated, truncated, info = env.step("<bash>true</bash>")
    assert truncated and not terminated and reward == 1.0 and info["end_reason"] == "max_steps"
