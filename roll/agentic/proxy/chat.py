"""Between OpenAI chat messages and the engine's token ids: what the chat template is shown, the
canonical form that recognises a message the proxy produced, and the assistant reply built from
generated ids.

- `template_messages`: requests' messages as our chat templates render them (role/content
  strings): "developer" is "system", content parts are joined, and an assistant message's
  `tool_calls` become Hermes `<tool_call>{...}</tool_call>` blocks in its content (the format the
  policy writes them in and the templates show).
- `canonical`: a message reduced to what decides its tokens, so that the assistant message an
  agent echoes back (content None or "", arguments re-serialised, extra None keys) is recognised
  as the one the proxy returned.
- `reply`: the generated ids as an assistant message: text decoded without special tokens, a
  single-token stop string cut from the text (OpenAI's semantics; the ids keep it), and, when
  tools are on, every well-formed `<tool_call>` block as an OpenAI tool call with a deterministic
  id (finish reason "tool_calls").
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from roll.agentic.agent_loop.tools import parse_tool_calls
from roll.agentic.proxy.protocol import Message
from roll.core.records import GenerateOutput


def _hermes(name: str, arguments: Any) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def template_messages(messages: list[Message]) -> list[dict]:
    """`messages` as the chat template takes them (see the module docstring)."""
    out = []
    for m in messages:
        content = m.text()
        if m.role == "assistant" and m.tool_calls:
            blocks = "".join(_hermes(c.function.name, _arguments(c.function.arguments)) for c in m.tool_calls)
            content = f"{content}{blocks}"
        entry = {"role": "system" if m.role == "developer" else m.role, "content": content}
        if m.role == "tool" and m.name:
            entry["name"] = m.name
        out.append(entry)
    return out


def canonical(message: Message) -> str:
    """What decides a message's tokens, as a JSON string (see the module docstring)."""
    role = "system" if message.role == "developer" else message.role
    calls = [[c.id, c.function.name, _arguments(c.function.arguments)] for c in message.tool_calls or []]
    return json.dumps([role, message.text(), calls, message.tool_call_id], sort_keys=True)


def chain(messages: list[Message], tools: list[dict] | None) -> list[str]:
    """Hash of every prefix of `messages` (entry i: through message i), rooted in the tools."""
    digest = hashlib.blake2b(json.dumps(tools or [], sort_keys=True).encode(), digest_size=16).hexdigest()
    hashes = []
    for m in messages:
        digest = extend_chain(digest, m)
        hashes.append(digest)
    return hashes


def extend_chain(digest: str, message: Message) -> str:
    """The chain hash of the messages `digest` covers followed by `message`."""
    return hashlib.blake2b(f"{digest}|{canonical(message)}".encode(), digest_size=16).hexdigest()


@dataclass
class Reply:
    """One generated choice as OpenAI shows it."""

    message: Message
    finish_reason: str  # "stop", "length" or "tool_calls"
    out: GenerateOutput

    def message_dict(self) -> dict:
        body = {"role": "assistant", "content": self.message.content}
        if self.message.tool_calls:
            body["tool_calls"] = [c.model_dump() for c in self.message.tool_calls]
        return body


def reply(tokenizer, out: GenerateOutput, stop_ids: set[int], tools_on: bool) -> Reply:
    """The assistant message of `out` (see the module docstring)."""
    ids = list(out.token_ids)
    if out.finish_reason == "stop" and ids and ids[-1] in stop_ids:
        ids = ids[:-1]  # a stop string is not part of the answer's text
    text = tokenizer.decode(ids, skip_special_tokens=True)
    calls = [c for c in parse_tool_calls(text) if c.error is None] if tools_on else []
    if not calls:
        message = Message(role="assistant", content=text)
        return Reply(message, "stop" if out.finish_reason == "stop" else "length", out)
    prefix = text[: text.find("<tool_call>")].strip()
    base = hashlib.blake2b(out.request_id.encode(), digest_size=6).hexdigest()
    tool_calls = [
        {
            "id": f"call_{base}_{k}",
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
        }
        for k, c in enumerate(calls)
    ]
    message = Message(role="assistant", content=prefix or None, tool_calls=tool_calls)
    return Reply(message, "tool_calls", out)


def token_logprobs(tokenizer, out: GenerateOutput) -> list[dict]:
    """OpenAI's `logprobs.content`: one entry per generated id, its engine log-prob (no
    alternatives: the engine returns the sampled token's only)."""
    entries = []
    for token_id, logprob in zip(out.token_ids, out.logprobs, strict=True):
        token = tokenizer.decode([token_id])
        entries.append({"token": token, "logprob": float(logprob), "bytes": list(token.encode()), "top_logprobs": []})
    return entries
