"""ROLL's `tool_wrapper` for GEM envs, with GEM's python-code tool running in our sandbox.

`tool_wrapper: {wrapper_args: {...}, tool_configs: [{tool_id: python_code, tool_args: {...}}]}`
is ROLL's per-tag block (custom_envs.<Tag>.tool_wrapper). `wrapper_args` go to GEM's
`ToolEnvWrapper` (tool_reward, tool_success_reward, max_tool_uses); `python_code`'s `tool_args`
are GEM's (timeout, sandbox_type, keep_error_last_line). GEM runs such code in a plain
subprocess; `SandboxedPythonCodeTool` keeps GEM's parsing and its "Code execution result: "
observation but runs the code in the episode's `Sandbox` (one per episode, closed at its end), with
`timeout` as the wall-clock limit. `sandbox_type` is accepted and ignored: the isolation is ours
and is reported in the metrics (`sandbox_namespaces`). Other tool ids are refused by name.
"""

from __future__ import annotations

from typing import Any

from roll.agentic.sandbox import Sandbox, SandboxLimits

WRAPPER_ARGS = ("tool_reward", "tool_success_reward", "max_tool_uses")
PYTHON_CODE_ARGS = ("timeout", "sandbox_type", "keep_error_last_line")


def _check_keys(where: str, given: dict, accepted: tuple[str, ...]) -> None:
    unknown = sorted(set(given) - set(accepted))
    if unknown:
        raise TypeError(f"unknown {where} key(s) {unknown}; accepted: {list(accepted)}")


class EpisodeSandbox:
    """The sandbox of the current episode, made on first use and closed at the episode's end."""

    def __init__(self, limits: SandboxLimits, isolation: str) -> None:
        self.limits, self.isolation = limits, isolation
        self.sandbox: Sandbox | None = None
        self.violations = 0
        self.commands = 0
        self.namespaces = 0.0

    def get(self) -> Sandbox:
        if self.sandbox is None:
            self.sandbox = Sandbox(self.limits, isolation_mode=self.isolation)
            self.namespaces = float(self.sandbox.mode == "namespaces")
        return self.sandbox

    def new_episode(self) -> None:
        self.end_episode()
        self.violations = self.commands = 0

    def end_episode(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None

    def metrics(self) -> dict[str, float]:
        return {
            "sandbox_commands": float(self.commands),
            "sandbox_violations": float(self.violations),
            "sandbox_namespaces": self.namespaces,
        }


def make_python_code_tool(episode: EpisodeSandbox, **tool_args: Any):
    """GEM's `PythonCodeTool`, executing in `episode`'s sandbox."""
    from gem.tools.python_code_tool import PythonCodeTool

    class SandboxedPythonCodeTool(PythonCodeTool):
        def execute_action(self, action: str):
            code, parsed_action, is_valid = self._parse_action(action)
            if not is_valid:
                return False, True, "", parsed_action
            result = episode.get().run_python(code)
            episode.commands += 1
            episode.violations += int(result.violation)
            output = result.output
            if result.reason not in ("ok", "exit_code"):
                output = f"{output}\n[sandbox: {result.reason}]"
            if result.reason != "ok" and self.keep_error_last_line:
                output = output.rstrip("\n").split("\n")[-1]
            return (
                True,
                result.reason != "ok",
                f"Code execution result: {output.lstrip(' ' + chr(10))}\n",
                parsed_action,
            )

    return SandboxedPythonCodeTool(**tool_args)


def wrap_with_tools(env: Any, block: dict[str, Any], *, sandbox: dict | None, isolation: str):
    """(GEM's ToolEnvWrapper around `env`, the `EpisodeSandbox` its python tool runs in)."""
    from gem.tools.tool_env_wrapper import ToolEnvWrapper

    _check_keys("tool_wrapper", block, ("wrapper_args", "tool_configs"))
    wrapper_args = dict(block.get("wrapper_args") or {})
    _check_keys("tool_wrapper.wrapper_args", wrapper_args, WRAPPER_ARGS)
    limits = SandboxLimits.of(sandbox)
    configs = list(block.get("tool_configs") or [])
    if len(configs) != 1:
        raise ValueError(f"tool_wrapper.tool_configs must name exactly one tool (python_code), got {len(configs)}")
    tools, episode = [], None
    for i, tool in enumerate(configs):
        _check_keys(f"tool_wrapper.tool_configs[{i}]", tool, ("tool_id", "tool_args"))
        if tool.get("tool_id") != "python_code":
            raise ValueError(
                f"tool_wrapper.tool_configs[{i}].tool_id {tool.get('tool_id')!r} is not supported: "
                "only python_code (run in roll's sandbox); search and MCP tools need services not run here"
            )
        args = dict(tool.get("tool_args") or {})
        _check_keys(f"tool_wrapper.tool_configs[{i}].tool_args", args, PYTHON_CODE_ARGS)
        tool_limits = SandboxLimits(**{**vars(limits), "wall_s": float(args.get("timeout", limits.wall_s))})
        episode = EpisodeSandbox(tool_limits, isolation)
        tools.append(make_python_code_tool(episode, **args))
    return ToolEnvWrapper(env, tools, **wrapper_args), episode
