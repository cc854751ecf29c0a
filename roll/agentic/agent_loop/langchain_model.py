"""`RollChatModel`: a LangChain chat model over our token-in/token-out client, so that a LangGraph
graph (or any LangChain agent) can be the rollout logic while PPO still trains on exactly the ids
the engine sampled (the approach of ChatLearn's and verl's LangGraph agent loops).

A LangChain chat model is called with the whole message list every turn; re-rendering it with the
chat template would re-tokenize past assistant turns (and templates that rewrite history, as Qwen3
drops earlier `<think>` blocks, would hand PPO ids the policy never sampled). So the model keeps
one `Conversation` per branch: a `TokenLedger` plus the messages it holds. When a call's messages
are such a conversation plus new tool / user messages, the prompt is the ledger's ids followed by
`continuation_ids` of the new messages; history is never re-rendered. Anything else (history
trimmed, edited or reordered, a second branch) gets a fresh ledger rendered from the messages,
counted in `metrics()["retemplated_turns"]`.

The returned `AIMessage` carries the generated ids, their log-probs and the prompt ids in
`response_metadata`, and `tool_calls` parsed from the Hermes `<tool_call>` markup, so LangGraph's
`ToolNode` runs them. A block that is not valid JSON, or names a tool that was not bound, becomes
an entry of `invalid_tool_calls` and costs its turn `format_penalty`; nothing the policy writes
raises. Past `max_turns` generations or `max_total_tokens`, the model answers an empty message
whose `response_metadata["stop_reason"]` is "max_steps" / "max_tokens" (so a ReAct graph ends).

Only the async path exists (`ainvoke` / `agenerate`). `bind_tools` ignores `tool_choice` (the
engine cannot force a call). The page: docs/agents.md.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.messages.tool import invalid_tool_call, tool_call
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, PrivateAttr

from roll.agentic.agent_loop.base import continuation_ids, encode, render_text
from roll.agentic.agent_loop.tool_agent import TOOLS_SYSTEM_PROMPT
from roll.agentic.agent_loop.tools import parse_tool_calls
from roll.agentic.episode import TokenLedger
from roll.core.enums import StopReason
from roll.core.records import GenerateOutput

# (turn, prompt_ids, max_new_tokens) -> the engine's output; turn numbers the episode's requests
GenerateFn = Callable[[int, list[int], int], Awaitable[GenerateOutput]]
_ROLES = {SystemMessage: "system", HumanMessage: "user", AIMessage: "assistant", ToolMessage: "tool"}


def message_text(message: BaseMessage) -> str:
    """The text of a message whose content may be a string or a list of content blocks."""
    if isinstance(message.content, str):
        return message.content
    return "".join(b if isinstance(b, str) else str(b.get("text", "")) for b in message.content)


def to_chat_dict(message: BaseMessage) -> dict[str, Any]:
    """A LangChain message as the chat-template dict. An assistant message that has tool calls but
    no markup (written by the graph, not generated) gets the Hermes blocks the model would write."""
    role = next((r for cls, r in _ROLES.items() if isinstance(message, cls)), getattr(message, "role", None))
    if role is None:
        raise TypeError(f"cannot render a {type(message).__name__} for the chat template")
    out: dict[str, Any] = {"role": role, "content": message_text(message)}
    if isinstance(message, AIMessage) and message.tool_calls and "<tool_call>" not in out["content"]:
        out["content"] += "".join(
            f"<tool_call>{json.dumps({'name': c['name'], 'arguments': c['args']})}</tool_call>"
            for c in message.tool_calls
        )
    if isinstance(message, ToolMessage) and message.name:
        out["name"] = message.name
    return out


def prompt_ids_with_tools(tokenizer: Any, messages: list[dict], schemas: list[dict] | None) -> list[int]:
    """The first prompt with the tool schemas: through the template when it renders them, else in
    the system message (as `ToolAgent.first_prompt_ids`, so both agents show tools alike)."""
    if not schemas:
        return encode(tokenizer, render_text(tokenizer, messages, True))
    with_tools = render_text(tokenizer, messages, True, tools=schemas)
    if with_tools != render_text(tokenizer, messages, True):
        return encode(tokenizer, with_tools)
    described = TOOLS_SYSTEM_PROMPT.format(schemas="\n".join(json.dumps(s["function"]) for s in schemas))
    if messages and messages[0]["role"] == "system":
        messages = [{**messages[0], "content": f"{messages[0]['content']}\n\n{described}"}, *messages[1:]]
    else:
        messages = [{"role": "system", "content": described}, *messages]
    return encode(tokenizer, render_text(tokenizer, messages, True))


@dataclass
class Conversation:
    """One branch: its ledger, the messages (chat dicts) it holds up to its last generated turn,
    and that turn's output (None before the first)."""

    index: int
    ledger: TokenLedger
    messages: list[dict]
    last: GenerateOutput | None = None
    num_valid: int = 0  # turns without a malformed tool call
    tool_calls: int = 0
    malformed_tool_calls: int = 0
    busy: bool = False  # generating: a concurrent branch must not append to this ledger meanwhile

    def extension(self, messages: list[dict]) -> list[dict] | None:
        """The tool / user messages `messages` appends to this conversation, or None when it is
        not this conversation continued (then its ids cannot be reused)."""
        n = len(self.messages)
        if self.busy or self.last is None or len(messages) <= n or messages[:n] != self.messages:
            return None
        new = messages[n:]
        return new if all(m["role"] in ("tool", "user") for m in new) else None


class RollChatModel(BaseChatModel):
    """A chat model for one episode: it generates through `generate_fn` and keeps every branch's
    token ledger (see the module docstring). Build a new one per episode."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    generate_fn: Any  # GenerateFn; Any so that pydantic does not wrap the callable
    tokenizer: Any
    max_turns: int = 8
    max_tokens_per_turn: int = 256
    max_total_tokens: int = 4096
    format_penalty: float = -0.1
    _conversations: list[Conversation] = PrivateAttr(default_factory=list)
    _turns: int = PrivateAttr(default=0)
    _retemplated: int = PrivateAttr(default=0)

    @property
    def _llm_type(self) -> str:
        return "roll-token-in-token-out"

    def bind_tools(self, tools: Sequence[Any], *, tool_choice: Any = None, **kwargs: Any) -> Runnable:
        """Bind LangChain tools (or functions, or OpenAI-format dicts) as JSON schemas that reach
        the chat template on a fresh conversation's first prompt."""
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    # -- state read by the agent --
    @property
    def conversations(self) -> list[Conversation]:
        return list(self._conversations)

    def conversation(self, index: int | None) -> Conversation | None:
        """The conversation `index` (from an AIMessage's metadata), else the latest one."""
        if index is not None and 0 <= index < len(self._conversations):
            return self._conversations[index]
        return self._conversations[-1] if self._conversations else None

    def metrics(self) -> dict[str, float]:
        return {
            "retemplated_turns": float(self._retemplated),
            "conversations": float(len(self._conversations)),
            "generated_turns": float(self._turns),
        }

    # -- generation --
    def _generate(
        self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        raise NotImplementedError("RollChatModel is async only: use ainvoke / agenerate")

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        tools: list[dict] | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        """One turn: continue the matching conversation (or start one), generate, parse tool calls.
        `stop` is ignored: the engine stops on the template's end-of-turn token."""
        dicts = [to_chat_dict(m) for m in messages]
        conv, context = self._locate(dicts, tools)
        limit = self._limit(len(conv.ledger.token_ids) + len(context))
        fresh = conv.index == len(self._conversations)
        keep = fresh and (limit is None or not self._conversations)  # a refused branch only if alone
        if keep:
            self._retemplated += bool(self._conversations)
            self._conversations.append(conv)
        if limit is not None:
            index = None if fresh and not keep else conv.index
            return _result(AIMessage(content="", response_metadata={"stop_reason": limit, "conversation": index}))
        conv.ledger.add_context(context)
        prompt_ids, turn = conv.ledger.token_ids, self._turns
        self._turns += 1
        room = self.max_total_tokens - len(prompt_ids)
        conv.busy = True
        try:
            out = await self.generate_fn(turn, prompt_ids, min(self.max_tokens_per_turn, room))
        finally:
            conv.busy = False
        conv.ledger.add_turn(out)
        message = self._message(conv, out, prompt_ids, turn, {t["function"]["name"] for t in tools or []})
        conv.messages, conv.last = dicts + [to_chat_dict(message)], out
        return _result(message)

    def _locate(self, dicts: list[dict], tools: list[dict] | None) -> tuple[Conversation, list[int]]:
        """The conversation `dicts` continues and the ids to append before generating, or a new,
        not yet registered conversation rendered from `dicts`."""
        for conv in reversed(self._conversations):
            new = conv.extension(dicts)
            if new is not None and conv.last is not None:  # an extension has a last turn
                return conv, continuation_ids(self.tokenizer, new, conv.last)
        ledger = TokenLedger(prompt_ids_with_tools(self.tokenizer, dicts, tools))
        return Conversation(len(self._conversations), ledger, list(dicts)), []

    def _limit(self, num_ids: int) -> str | None:
        if self._turns >= self.max_turns:
            return StopReason.MAX_STEPS
        if num_ids >= self.max_total_tokens:
            return StopReason.MAX_TOKENS  # no room to generate
        return None

    def _message(
        self, conv: Conversation, out: GenerateOutput, prompt_ids: list[int], turn: int, tool_names: set[str]
    ) -> AIMessage:
        """The AIMessage of a generated turn; malformed calls are penalised on the turn's reward."""
        text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
        valid, invalid = [], []
        for i, call in enumerate(parse_tool_calls(text)):
            call_id = f"call_{turn}_{i}"
            error = call.error
            if error is None and call.name not in tool_names:
                error = f"unknown tool {call.name!r}; available: {', '.join(sorted(tool_names)) or 'none'}"
            if error is None and call.name is not None:  # the name is in tool_names
                valid.append(tool_call(name=call.name, args=call.arguments, id=call_id))
            else:
                invalid.append(invalid_tool_call(name=call.name, args=call.raw, id=call_id, error=error))
        conv.tool_calls += len(valid) + len(invalid)
        conv.malformed_tool_calls += len(invalid)
        if invalid:
            conv.ledger.step_rewards[-1] += float(self.format_penalty)
        else:
            conv.num_valid += 1
        if valid or invalid:
            stop_reason = "tool_calls"
        else:
            stop_reason = StopReason.of_answer(out.finish_reason)
        metadata = {
            "token_ids": list(out.token_ids),
            "logprobs": list(out.logprobs),
            "prompt_ids": prompt_ids,
            "finish_reason": out.finish_reason,
            "policy_version": out.policy_version,
            "turn": turn,
            "conversation": conv.index,
            "stop_reason": stop_reason,
        }
        return AIMessage(content=text, tool_calls=valid, invalid_tool_calls=invalid, response_metadata=metadata)


def _result(message: AIMessage) -> ChatResult:
    return ChatResult(generations=[ChatGeneration(message=message)])
