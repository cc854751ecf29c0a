"""A coding env whose agent runs shell and Python commands in a sandboxed workspace.

Each episode is one task of `tasks.TASKS` (picked by the seed, or named by `tasks`), in a fresh
`roll.agentic.sandbox.Sandbox` whose workspace holds the task's starter `solution.py`. Actions,
one per turn (the first block of the response counts; one left open runs to the end of the response,
as `extract_answer` reads a response cut at `max_tokens_per_step` or a stop string):
  `<bash>ls; cat solution.py</bash>`    run a shell command in the workspace
  `<python>print(1 + 1)</python>`       run Python code in the workspace
  `<write>def f(): ...</write>`         replace solution.py (a ``` fence around it is dropped)
  `<answer>submit</answer>`             grade solution.py with the hidden tests and end
The same actions are offered as OpenAI function tools (`TOOL_SCHEMAS`: `bash(command)`,
`python(code)`, `write(content)`, `submit()`); `tool_call_action` turns a call into the action text,
so a tool-calling agent (`roll.agentic.proxy.runners.ToolCallRunner`) plays the same episode.
The observation is the command's output (the workspace path shown as /workspace, non-printable
characters as ?, cut to fit) and its exit status. Reward: 0 per step; at the end (submit, or
`max_steps` actions) the share of hidden tests solution.py passes (`grader.grade`). A command
that hits a sandbox limit or is refused an escape (`roll.agentic.sandbox.VIOLATIONS`) ends the
episode with `violation_penalty` when `end_on_violation`; `info["end_reason"]` names why every
episode ended and `info["sandbox"]` says which isolation ran. The sandbox is closed (processes
killed, workspace removed) as soon as the episode ends. `scripted_action` is the expert: it
writes the task's solution, then submits.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from envs.code_sandbox.grader import grade
from envs.code_sandbox.tasks import TASKS, TASKS_BY_NAME, CodeTask
from roll.agentic.env import TextEnv
from roll.agentic.env.base import CHARSET, MAX_TEXT_CHARS
from roll.agentic.env.parsing import strip_special_tokens
from roll.agentic.sandbox import Sandbox, SandboxLimits

TOOLS = ("bash", "python", "write", "answer")
_BLOCK = re.compile(r"<\s*(bash|python|write|answer)\s*>(.*?)(?:<\s*/\s*\1\s*>|\Z)", re.IGNORECASE | re.DOTALL)
_FENCE = re.compile(r"^\s*```[\w+-]*\n(.*?)\n?```\s*$", re.DOTALL)
_ALLOWED = frozenset(CHARSET)
MAX_OBS_CHARS = 4000


def _tool(name: str, description: str, **params: str) -> dict[str, Any]:
    properties = {p: {"type": "string", "description": d} for p, d in params.items()}
    schema = {"type": "object", "properties": properties, "required": list(params)}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}


TOOL_SCHEMAS: tuple[dict[str, Any], ...] = (
    _tool("bash", "Run a shell command in the workspace; returns its output and exit status.", command="the command"),
    _tool("python", "Run Python code in the workspace; returns its output and exit status.", code="the code"),
    _tool("write", "Replace solution.py with new content.", content="the whole new solution.py"),
    _tool("submit", "Grade solution.py with the hidden tests; ends the episode."),
)
"""The env's actions as OpenAI function tools: name -> the argument that fills its block."""
_TOOL_ARGUMENT = {"bash": "command", "python": "code", "write": "content", "submit": None}


def _printable(text: str) -> str:
    return "".join(c if c in _ALLOWED else "?" for c in text)


class CodeSandboxEnv(TextEnv):
    """Fix or write a function so that hidden tests pass; see the module docstring.

    `episode_metrics`: `tests_passed` (share, 0 before the end), `submitted`, `commands`,
    `violations` and `isolation_namespaces` (1 when the sandbox ran in Linux namespaces)."""

    actions: tuple[str, ...] = ()  # open text: see parse_action
    instruction = (
        "You are in a Linux workspace with a file solution.py. Make solution.py do what the task asks; "
        "hidden tests will check it. One action per answer: <bash>command</bash>, <python>code</python>, "
        "<write>new solution.py</write>, or <answer>submit</answer> when done."
    )

    def __init__(
        self,
        tasks: list[str] | None = None,
        max_steps: int = 6,
        sandbox: dict[str, Any] | None = None,
        isolation: str = "auto",
        end_on_violation: bool = True,
        violation_penalty: float = 0.0,
        format_penalty: float = -0.1,
        render_mode: str | None = None,
        env_instruction: str | None = None,
    ) -> None:
        super().__init__(format_penalty=format_penalty, render_mode=render_mode, env_instruction=env_instruction)
        unknown = sorted(set(tasks or ()) - set(TASKS_BY_NAME))
        if unknown:
            raise ValueError(f"unknown task(s) {unknown}; the task set has {sorted(TASKS_BY_NAME)}")
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.tasks: tuple[CodeTask, ...] = tuple(TASKS_BY_NAME[n] for n in tasks) if tasks else TASKS
        self.max_steps = max_steps
        self.limits = SandboxLimits.of(sandbox)
        self.isolation = isolation
        self.end_on_violation = end_on_violation
        self.violation_penalty = float(violation_penalty)
        self.task: CodeTask | None = None
        self._sandbox: Sandbox | None = None
        self._info: dict[str, Any] = {}
        self._grades: dict[tuple[str, str], list[bool]] = {}  # (task, solution sha) -> hidden test results
        self._passed = 0.0
        self._over = False
        self.end_reason = ""

    # --- episode ---------------------------------------------------------------------------
    def _reset(self, options: dict[str, Any]) -> str:
        self._close_sandbox()
        self.task = self.tasks[int(self.np_random.integers(len(self.tasks)))]
        self._sandbox = Sandbox(self.limits, isolation_mode=self.isolation)
        self._sandbox.write_file("solution.py", self.task.starter)
        self._passed, self._over, self.end_reason = 0.0, False, ""
        self._info = self._sandbox.info()
        return f"Task: {self.task.prompt}\nsolution.py:\n{self.task.starter}"

    def parse_action(self, text: str) -> str | None:
        """`tool\\n content` of the first tool block, or None (an empty or unknown block)."""
        if not isinstance(text, str):
            return None
        match = _BLOCK.search(strip_special_tokens(text))
        if match is None:
            return None
        tool, content = match.group(1).lower(), match.group(2).strip()
        if tool == "answer":
            return "answer\nsubmit" if content.lower() == "submit" else None
        if tool == "write":
            fenced = _FENCE.match(content)
            content = fenced.group(1) if fenced else content
        return f"{tool}\n{content}" if content else None

    @property
    def _open_sandbox(self) -> Sandbox:
        """The episode's sandbox: opened by every reset, closed only when the episode is over."""
        assert self._sandbox is not None, "reset() first"
        return self._sandbox

    def _apply(self, action: str) -> tuple[str, float, bool, bool]:
        if self._over:  # stepped after the end: nothing happens
            return self._frame or "", 0.0, True, False
        sandbox = self._open_sandbox
        tool, content = action.split("\n", 1)
        if tool == "answer":
            return self._finish("submitted")
        if tool == "write":
            sandbox.write_file("solution.py", content + ("\n" if not content.endswith("\n") else ""))
            obs = "solution.py written."
        else:
            run = sandbox.run_shell if tool == "bash" else sandbox.run_python
            result = run(content)
            obs = self._show(result.output, result.reason, result.exit_code)
            if result.violation and self.end_on_violation:
                return self._finish(f"sandbox violation: {result.reason}", obs, self.violation_penalty)
        if self._num_actions >= self.max_steps:
            return self._finish("max_steps", obs, truncated=True)
        return obs, 0.0, False, False

    def _finish(
        self, reason: str, obs: str = "", reward: float | None = None, truncated: bool = False
    ) -> tuple[str, float, bool, bool]:
        """Grade solution.py (unless a violation decides the reward), close the sandbox."""
        tests = self._grade() if reward is None else []
        if tests:
            self._passed = sum(tests) / len(tests)
            obs = f"{obs}\nHidden tests: {sum(tests)}/{len(tests)} passed.".strip()
        self.end_reason = reason
        self._over = True
        self._close_sandbox()
        obs = f"{obs}\nEpisode over: {reason}.".strip()
        return obs, self._passed if reward is None else reward, not truncated, truncated

    def _grade(self) -> list[bool]:
        sandbox, task = self._open_sandbox, self.task
        assert task is not None, "reset() first"  # set with the sandbox
        code = sandbox.read_file("solution.py") or ""
        key = (task.name, hashlib.sha256(code.encode()).hexdigest())
        if key not in self._grades:  # grading is deterministic for a given solution text
            self._grades[key] = grade(sandbox, task.tests)
        return self._grades[key]

    def _show(self, output: str, reason: str, exit_code: int | None) -> str:
        output = output.replace(self._open_sandbox.workspace, "/workspace")
        status = f"[exit {exit_code}]" if reason in ("ok", "exit_code") else f"[stopped: {reason}]"
        if len(output) > MAX_OBS_CHARS:
            output = output[: MAX_OBS_CHARS // 2] + "\n...\n" + output[-MAX_OBS_CHARS // 2 :]
        return _printable(f"{output}\n{status}".strip())[:MAX_TEXT_CHARS]

    def _close_sandbox(self) -> None:
        if self._sandbox is not None:
            self._info = self._sandbox.info()
            self._sandbox.close()
            self._sandbox = None

    # --- reporting -------------------------------------------------------------------------
    @property
    def success(self) -> bool:
        return self._passed == 1.0

    def episode_metrics(self) -> dict[str, float]:
        info = self._sandbox.info() if self._sandbox is not None else self._info
        return {
            "tests_passed": float(self._passed),
            "submitted": float(self.end_reason == "submitted"),
            "commands": float(info.get("commands", 0)),
            "violations": float(sum(info.get("violations", {}).values())),
            "isolation_namespaces": float(info.get("isolation") == "namespaces"),
        }

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = super().step(action)
        sandbox = self._sandbox.info() if self._sandbox is not None else self._info
        info["sandbox"] = {k: v for k, v in sandbox.items() if k not in ("limits", "uid")}  # same seed, same info
        if terminated or truncated:
            info["end_reason"] = self.end_reason
        return obs, reward, terminated, truncated, info

    def scripted_action(self) -> str | None:
        """The expert: write the task's solution, then submit."""
        if self.task is None or self._over or self._sandbox is None:
            return None
        if self._sandbox.read_file("solution.py") != self.task.solution:
            return f"<write>{self.task.solution}</write>"
        return "<answer>submit</answer>"

    def tool_schemas(self) -> list[dict[str, Any]]:
        """`TOOL_SCHEMAS`: the actions as OpenAI function tools."""
        return [dict(t) for t in TOOL_SCHEMAS]

    def tool_call_action(self, name: str, arguments: Any) -> str:
        """The action text of a call of one of `TOOL_SCHEMAS` (`bash` with {"command": "ls"} ->
        "<bash>ls</bash>"); an unknown tool or a missing argument gives "" (an invalid action:
        `format_penalty`, nothing runs). Content holding the block's own closing tag is cut there,
        as it would be in text."""
        if name not in _TOOL_ARGUMENT:
            return ""
        if name == "submit":
            return "<answer>submit</answer>"
        value = arguments.get(_TOOL_ARGUMENT[name]) if isinstance(arguments, dict) else None
        return f"<{name}>{value}</{name}>" if isinstance(value, str) else ""

    def tokenizer_whole_words(self) -> list[str]:
        """The tool tags, `submit`, and the words of a Hermes tool call of `TOOL_SCHEMAS`, as
        whole tokens of a tiny local tokenizer."""
        calls = ["<tool_call>", "</tool_call>", '"name"', '"arguments"']
        calls += [f'"{n}"' for n in _TOOL_ARGUMENT] + [f'"{a}"' for a in _TOOL_ARGUMENT.values() if a]
        return [*(f"<{tool}>" for tool in TOOLS), *(f"</{tool}>" for tool in TOOLS), "submit", *calls]

    def tokenizer_corpus(self) -> list[str]:
        """Every text of the task set and the env's fixed messages (for `roll.pipeline.tiny_model`)."""
        fixed = [self.instruction, "solution.py written.", "Hidden tests: passed.", "Episode over: submitted."]
        fixed += ["ls", "cat solution.py", "python -c", "[exit 0]", "[exit 1]", "Traceback", "Error", "tool"]
        fixed += [json.dumps(list(TOOL_SCHEMAS))]  # shown to a tool-calling agent
        texts = [f"Task: {t.prompt}\nsolution.py:\n{t.starter}\n{t.solution}" for t in self.tasks]
        return fixed + texts

    def close(self) -> None:
        self._close_sandbox()
        super().close()
