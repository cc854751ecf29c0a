"""The part of OpenAI's chat completions API the proxy serves, as pydantic models of the request.

A request is validated before anything is tokenized; a field that is malformed, or that asks for
something the engine cannot do, is a `RequestError` naming it (`tools.0.function.name`), which the
server answers with HTTP 400 in OpenAI's error shape. Served: `model`, `messages` (system,
developer, user, assistant with `tool_calls`, tool), `tools` / `tool_choice`, `n`, `temperature`,
`top_p`, `max_tokens` / `max_completion_tokens`, `stop` (strings that are one token each: the
engine stops on token ids), `logprobs`, `seed`, `stream`. Accepted because they change nothing
here: `user`, `metadata`, `store`, `parallel_tool_calls`, `stream_options`, penalties and
`top_logprobs` at their neutral values, `response_format` of type "text". Any other key is refused
by name: silently ignoring it would train on behaviour the agent did not ask for.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class RequestError(ValueError):
    """A request the proxy refuses: `param` names the field (OpenAI's error `param`)."""

    def __init__(self, param: str | None, message: str, status: int = 400):
        super().__init__(message)
        self.param = param
        self.message = message
        self.status = status

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": None}}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionDef(_Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not _FUNCTION_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not a function name (1-64 of a-z, A-Z, 0-9, _ and -)")
        return name

    @field_validator("parameters")
    @classmethod
    def _schema(cls, schema: dict | None) -> dict | None:
        if schema is not None and schema.get("type", "object") != "object":
            raise ValueError(f"must be a JSON schema of type 'object', not {schema.get('type')!r}")
        return schema


class ToolDef(_Strict):
    type: Literal["function"]
    function: FunctionDef


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    """One chat message. Unknown keys are allowed: clients echo back the assistant message as they
    received it (`refusal`, `annotations`, `audio` ... all None here)."""

    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCallOut] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        """The content as one string; only text parts are served (the policy is a text model)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text":
                raise ValueError(f"content part of type {part.get('type')!r}: only 'text' parts are served")
            parts.append(str(part.get("text", "")))
        return "".join(parts)


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: dict[Literal["name"], str]


class ChatCompletionRequest(_Strict):
    model: str | None = None  # None: the policy (ROLL's runners send no model)
    messages: list[Message] = Field(min_length=1)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    n: int = Field(1, ge=1, le=16)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    logprobs: bool = False
    top_logprobs: Literal[0] | None = None
    seed: int | None = None
    stream: bool = False
    # accepted, neutral here
    stream_options: dict[str, Any] | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    parallel_tool_calls: bool | None = None
    frequency_penalty: Literal[0] | None = None
    presence_penalty: Literal[0] | None = None
    response_format: dict[Literal["type"], Literal["text"]] | None = None

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


def parse_request(body: Any) -> ChatCompletionRequest:
    """`body` (decoded JSON) as a request, or a `RequestError` naming the first bad field."""
    if not isinstance(body, dict):
        raise RequestError(None, f"the request body must be a JSON object, not {type(body).__name__}")
    try:
        request = ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"] if not _is_union_tag(p))
        what = (
            "is not a field of the chat completions API served here"
            if err["type"] == "extra_forbidden"
            else err["msg"].removeprefix("Value error, ")
        )
        raise RequestError(where or None, f"{where}: {what}") from None
    for i, message in enumerate(request.messages):
        try:
            message.text()
        except ValueError as e:
            raise RequestError(f"messages.{i}.content", f"messages.{i}.content: {e}") from None
    _check_tool_choice(request)
    return request


def _is_union_tag(part: Any) -> bool:
    """pydantic names the branch of a union it tried (`str`, `list[...]`, `function-after[...]`)."""
    return isinstance(part, str) and (part in ("str", "int", "float") or "[" in part)


def _check_tool_choice(request: ChatCompletionRequest) -> None:
    choice = request.tool_choice
    names = {t.function.name for t in request.tools or []}
    if isinstance(choice, NamedToolChoice) and choice.function.get("name") not in names:
        raise RequestError("tool_choice", f"tool_choice: no tool named {choice.function.get('name')!r} in tools")
    if choice == "required" and not names:
        raise RequestError("tool_choice", "tool_choice: 'required' needs tools")
