"""Tools: schemas from signatures, Hermes call parsing, and running calls (parallel, bounded,
never raising)."""

import asyncio
import threading

import pytest

from roll.agentic.agent_loop.tools import (
    Tool,
    ToolCall,
    as_tool,
    parse_tool_calls,
    run_tool_calls,
    tool_map,
)


def search(query: str, limit: int = 5, tags: list[str] | None = None) -> list[str]:
    """Search the catalogue.

    Only products in stock are returned.

    Args:
        query: words to look for.
        limit: at most this many
            results.
        tags (list[str]): filter by tags.
    """
    return [query] * limit


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def slow_async(x: int) -> int:
    await asyncio.sleep(30)
    return x


def boom() -> str:
    raise RuntimeError("disk on fire")


def dump(json: dict, schema: str = "s") -> dict:  # parameter names that shadow BaseModel attributes
    """Echo."""
    return {"json": json, "schema": schema}


def run(coro):
    return asyncio.run(coro)


def test_schema_from_signature_hints_and_docstring():
    assert Tool(search).schema == {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the catalogue. Only products in stock are returned.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "words to look for."},
                    "limit": {"type": "integer", "default": 5, "description": "at most this many results."},
                    "tags": {
                        "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
                        "default": None,
                        "description": "filter by tags.",
                    },
                },
                "required": ["query"],
                "additionalProperties": False,
            },
        },
    }


def test_parameters_named_like_basemodel_attributes(recwarn):
    tool = Tool(dump)
    assert list(tool.schema["function"]["parameters"]["properties"]) == ["json", "schema"]
    assert tool.validate({"json": {"k": 1}}) == {"json": {"k": 1}, "schema": "s"}
    assert not [w for w in recwarn if "shadows" in str(w.message)]


def test_as_tool_from_import_path_and_duplicate_names():
    tool = as_tool("os.path:basename")
    assert tool.name == "basename" and "p" in tool.schema["function"]["parameters"]["properties"]
    with pytest.raises(ValueError, match="two tools are named 'add'"):
        tool_map([add, Tool(search, name="add")])
    with pytest.raises(TypeError, match="must be callable"):
        as_tool(3)
    with pytest.raises(ValueError, match="tool 'os.path:nope' not found"):
        as_tool("os.path:nope")


def test_parse_several_calls_and_argument_strings():
    text = (
        'I will look. <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>\n'
        '<tool_call> {"name": "search", "arguments": "{\\"query\\": \\"red\\"}"} </tool_call>'
        '<tool_call>{"name": "boom"}</tool_call>'
    )
    calls = parse_tool_calls(text)
    assert [(c.name, c.arguments, c.error) for c in calls] == [
        ("add", {"a": 1, "b": 2}, None),
        ("search", {"query": "red"}, None),
        ("boom", {}, None),
    ]
    assert parse_tool_calls("The answer is 3.") == []


@pytest.mark.parametrize(
    "body, error",
    [
        ('{"name": "add", "arguments": {"a": 1,}}', "invalid JSON in <tool_call>"),
        ('["add", 1]', 'a tool call must be {"name": ..., "arguments": {...}}'),
        ('{"arguments": {}}', 'a tool call must be {"name": ..., "arguments": {...}}'),
        ('{"name": "add", "arguments": [1, 2]}', "tool call arguments must be a JSON object"),
    ],
)
def test_malformed_blocks_are_structured_errors(body, error):
    (call,) = parse_tool_calls(f"<tool_call>{body}</tool_call>")
    assert call.error.startswith(error) and call.raw == body


def test_unterminated_block():
    calls = parse_tool_calls('<tool_call>{"name": "add", "arguments": {}}</tool_call><tool_call>{"name": "a')
    assert calls[0].error is None and calls[1].error == "unterminated <tool_call> block"


def test_results_in_call_order_with_every_failure_kind():
    calls = parse_tool_calls(
        '<tool_call>{"name": "add", "arguments": {"a": "3", "b": 4}}</tool_call>'  # "3" coerced
        '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2, "c": 3}}</tool_call>'
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "boom", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "search", "arguments": {"query": "x", "limit": 2}}</tool_call>'
        "<tool_call>not json</tool_call>"
    )
    results = run(run_tool_calls(calls, [add, boom, search], timeout_s=5))
    assert [r.status for r in results] == [
        "ok",
        "bad_arguments",
        "bad_arguments",
        "unknown_tool",
        "error",
        "ok",
        "malformed",
    ]
    assert [r.malformed for r in results] == [False, True, True, True, False, False, True]
    assert results[0].content == "7"
    assert results[1].content == "Error: invalid arguments for add: b: Field required"
    assert results[2].content == "Error: invalid arguments for add: c: Extra inputs are not permitted"
    assert results[3].content == "Error: unknown tool 'nope'; available: add, boom, search"
    assert results[4].content == "Error: boom raised RuntimeError: disk on fire"
    assert results[5].content == '["x", "x"]'
    assert results[6].content.startswith("Error: invalid JSON in <tool_call>")


def test_async_tool_past_its_timeout_is_an_error_for_the_model():
    (result,) = run(run_tool_calls([ToolCall("slow_async", {"x": 1})], [slow_async], timeout_s=0.05))
    assert (result.status, result.content) == ("timeout", "Error: slow_async timed out after 0.05s")


def test_sync_tool_past_its_timeout_leaves_only_its_own_thread():
    release = threading.Event()

    def stuck() -> str:
        release.wait(30)
        return "late"

    try:
        results = run(
            run_tool_calls([ToolCall("stuck", {}), ToolCall("add", {"a": 1, "b": 1})], [stuck, add], timeout_s=0.05)
        )
        assert [(r.status, r.content) for r in results] == [
            ("timeout", "Error: stuck timed out after 0.05s"),
            ("ok", "2"),
        ]
    finally:
        release.set()  # let the abandoned thread end


def test_calls_of_one_turn_run_concurrently():
    """ping and pong each wait for the other to start: run one after the other they would both
    time out (5 s), run together both return at once."""
    started = {}

    async def ping() -> str:
        started["ping"].set()
        await started["pong"].wait()
        return "ping done"

    async def pong() -> str:
        started["pong"].set()
        await started["ping"].wait()
        return "pong done"

    async def main():
        started.update(ping=asyncio.Event(), pong=asyncio.Event())
        return await run_tool_calls([ToolCall("ping", {}), ToolCall("pong", {})], [ping, pong], timeout_s=5)

    assert [r.content for r in run(main())] == ["ping done", "pong done"]


def test_sync_tools_run_in_parallel_threads():
    barrier = threading.Barrier(2, timeout=5)  # broken (an exception) unless both threads arrive

    def left() -> str:
        barrier.wait()
        return "left"

    def right() -> str:
        barrier.wait()
        return "right"

    results = run(run_tool_calls([ToolCall("left", {}), ToolCall("right", {})], [left, right], timeout_s=10))
    assert [(r.status, r.content) for r in results] == [("ok", "left"), ("ok", "right")]
