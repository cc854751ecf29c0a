"""Tools for tool-calling agents: any Python callable is a tool.

A tool's JSON schema (the OpenAI / HF `tools=` format) comes from its signature, type hints and
docstring through a pydantic model built from the signature, and the same model validates the
arguments the policy wrote, so the schema the model is shown and the check its calls pass cannot
disagree.

Calls are Hermes-style blocks, as Qwen chat templates ask the model to write them (several per
turn allowed):

    <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>

Nothing the policy writes raises out of the agent loop: malformed JSON, an unknown tool, bad
arguments, a tool that raises or one that runs past its timeout each become a `ToolResult` whose
`content` is an error message the model reads in the next turn, and whose `status` the agent counts
(and penalises, for the policy's own mistakes).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import threading
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pydantic

from roll.core.imports import ObjectNotFound, import_object

# The statuses that are the policy's fault (a format error), as opposed to the tool's.
MALFORMED = frozenset({"malformed", "unknown_tool", "bad_arguments"})
_BLOCK = re.compile(r"<tool_call>(.*?)(</tool_call>|\Z)", re.S)
_SECTION = re.compile(r"^(Args|Arguments|Parameters|Returns|Raises|Yields|Examples?):\s*$")
_ARG_LINE = re.compile(r"^\s+(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


@dataclass(frozen=True)
class ToolCall:
    """One `<tool_call>` block: the tool's name and arguments, or why the block is unusable."""

    name: str | None
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    raw: str = ""


@dataclass(frozen=True)
class ToolResult:
    """What one call gave back. `status`: "ok", "malformed", "unknown_tool", "bad_arguments"
    (the policy's mistakes, see `MALFORMED`), "error" (the tool raised) or "timeout"."""

    name: str
    content: str
    status: str = "ok"

    @property
    def malformed(self) -> bool:
        return self.status in MALFORMED


def _docstring_parts(fn: Callable) -> tuple[str, dict[str, str]]:
    """The summary of a Google-style docstring and the per-argument descriptions of its Args."""
    summary: list[str] = []
    args: dict[str, str] = {}
    section, current = None, None
    for line in (inspect.getdoc(fn) or "").splitlines():
        header = _SECTION.match(line)
        if header:
            section, current = header.group(1), None
        elif section is None:
            summary.append(line.strip())
        elif section in ("Args", "Arguments", "Parameters"):
            arg = _ARG_LINE.match(line)
            if arg and (current is None or len(line) - len(line.lstrip()) <= 4):
                current = arg.group(1)
                args[current] = arg.group(2).strip()
            elif current and line.strip():
                args[current] += " " + line.strip()
    return " ".join(s for s in summary if s), args


def _drop_titles(schema: Any) -> Any:
    """The schema without pydantic's generated "title" keys: tokens the model would read for
    nothing. Keys of "properties" / "$defs" are names, not schema keywords, and stay."""
    if isinstance(schema, list):
        return [_drop_titles(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in ("properties", "$defs"):
            out[key] = {name: _drop_titles(sub) for name, sub in value.items()}
        elif key != "title":
            out[key] = _drop_titles(value)
    return out


class Tool:
    """A callable with its name, description and an argument model built from its signature."""

    def __init__(self, fn: Callable, name: str | None = None, description: str | None = None):
        self.fn = fn
        self.name: str = name if name else getattr(fn, "__name__", type(fn).__name__)
        summary, arg_docs = _docstring_parts(fn)
        self.description = description if description is not None else summary
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004 - an async __call__, not callability
        try:
            hints = typing.get_type_hints(fn if inspect.isroutine(fn) else type(fn).__call__)
        except TypeError:  # a builtin has no annotations to read
            hints = {}
        fields: dict[str, Any] = {}
        self._params: list[tuple[str, str]] = []  # (model field, argument name)
        for i, p in enumerate(inspect.signature(fn).parameters.values()):
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue  # not expressible in a schema; the model cannot pass them
            default = ... if p.default is p.empty else p.default
            # fields are aliased so that a parameter named e.g. "json" cannot shadow BaseModel
            fields[f"arg{i}"] = (
                hints.get(p.name, Any),
                pydantic.Field(default, alias=p.name, description=arg_docs.get(p.name)),
            )
            self._params.append((f"arg{i}", p.name))
        self.args_model = pydantic.create_model(
            f"{self.name}_arguments", __config__=pydantic.ConfigDict(extra="forbid"), **fields
        )

    @property
    def schema(self) -> dict[str, Any]:
        """The tool in the OpenAI function format, as `apply_chat_template(tools=...)` takes it."""
        parameters = _drop_titles(self.args_model.model_json_schema(by_alias=True))
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": parameters},
        }

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Keyword arguments for `fn`, coerced to its types; raises pydantic.ValidationError."""
        validated = self.args_model.model_validate(dict(arguments))
        return {arg: getattr(validated, fld) for fld, arg in self._params}

    def invoke(self, kwargs: dict[str, Any]) -> Any:
        """An awaitable of the call: a coroutine for async tools, a new thread for sync ones."""
        if self.is_async:
            return self.fn(**kwargs)
        return _in_thread(self.fn, kwargs, self.name)


def _in_thread(fn: Callable, kwargs: dict[str, Any], name: str) -> asyncio.Future:
    """Run a sync tool in a fresh daemon thread. Not the shared default executor: a tool that
    hangs past its timeout cannot be killed, and in a pool it would hold a worker that env steps
    and other tools need; here it only holds its own thread until it returns."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if not future.done():  # cancelled by the timeout meanwhile
            future.set_exception(error) if error is not None else future.set_result(result)

    def target() -> None:
        try:
            result, error = fn(**kwargs), None
        except BaseException as e:  # handed to the awaiting loop, which reports it
            result, error = None, e
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop closed while the tool ran: nobody waits any more
            pass

    threading.Thread(target=target, daemon=True, name=f"tool-{name}").start()
    return future


def as_tool(obj: Tool | Callable | str) -> Tool:
    """A `Tool` from a Tool, a callable, or the import path "package.module:function"."""
    if isinstance(obj, Tool):
        return obj
    if isinstance(obj, str):
        try:
            obj = import_object(obj)
        except (ObjectNotFound, ImportError) as e:
            raise ValueError(f"tool {obj!r} not found ({e})") from None
    if not callable(obj):
        raise TypeError(f"a tool must be callable, got {obj!r}")
    return Tool(obj)


def tool_map(tools: Iterable[Tool | Callable | str]) -> dict[str, Tool]:
    """Tools by name; two tools with one name is an error (the model could not tell them apart)."""
    out: dict[str, Tool] = {}
    for tool in map(as_tool, tools):
        if tool.name in out:
            raise ValueError(f"two tools are named {tool.name!r}")
        out[tool.name] = tool
    return out


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every `<tool_call>` block of `text`, in order. A block that is not closed, not JSON, or
    not `{"name": str, "arguments": object}` is a ToolCall with `error` set (arguments given as
    a JSON string of an object are accepted: some models write them so)."""
    calls = []
    for match in _BLOCK.finditer(text):
        body, closed = match.group(1).strip(), bool(match.group(2))
        calls.append(_parse_block(body) if closed else ToolCall(None, error="unterminated <tool_call> block", raw=body))
    return calls


def _parse_block(body: str) -> ToolCall:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return ToolCall(None, error=f"invalid JSON in <tool_call>: {e.msg} at char {e.pos}", raw=body)
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall(None, error='a tool call must be {"name": ..., "arguments": {...}}', raw=body)
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    if not isinstance(arguments, dict):
        return ToolCall(obj["name"], error="tool call arguments must be a JSON object", raw=body)
    return ToolCall(obj["name"], arguments, raw=body)


async def run_tool_calls(
    calls: list[ToolCall], tools: Mapping[str, Tool] | Iterable[Tool | Callable], timeout_s: float | None = None
) -> list[ToolResult]:
    """Run the calls of one turn concurrently, each bounded by `timeout_s` (None: unbounded);
    results in call order. Never raises for anything a call or a tool does."""
    registry = tools if isinstance(tools, Mapping) else tool_map(tools)
    return list(await asyncio.gather(*(_run_one(call, registry, timeout_s) for call in calls)))


async def _run_one(call: ToolCall, tools: Mapping[str, Tool], timeout_s: float | None) -> ToolResult:
    name = call.name or "?"
    if call.error is not None:
        status = "bad_arguments" if call.name in tools else "malformed"
        return ToolResult(name, f"Error: {call.error}", status)
    tool = None if call.name is None else tools.get(call.name)
    if tool is None:
        known = ", ".join(sorted(tools)) or "none"
        return ToolResult(name, f"Error: unknown tool {call.name!r}; available: {known}", "unknown_tool")
    try:
        kwargs = tool.validate(call.arguments)
    except pydantic.ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'arguments'}: {err['msg']}" for err in e.errors())
        return ToolResult(name, f"Error: invalid arguments for {name}: {problems}", "bad_arguments")
    try:
        result = await asyncio.wait_for(tool.invoke(kwargs), timeout_s)
    except TimeoutError:
        return ToolResult(name, f"Error: {name} timed out after {timeout_s:g}s", "timeout")
    except Exception as e:  # the tool's own failure, reported to the model
        return ToolResult(name, f"Error: {name} raised {type(e).__name__}: {e}", "error")
    return ToolResult(name, result if isinstance(result, str) else json.dumps(result, default=str))
