"""The tool-calling agent: generate, run the tool calls the model wrote, show it the results,
until it answers without calling a tool (the ReAct / Hermes function-calling loop of verl's
`ToolAgentLoop` and ChatLearn's agent rollouts).

One turn: generate → parse `<tool_call>` blocks → none: the text is the final answer, stop →
otherwise run the calls concurrently (each bounded by `tool_timeout_s`) and append the tool
messages (role "tool") as the ids the chat template puts after an assistant turn
(`continuation_ids`, response_mask 0), then generate again from the grown sequence. Every request
carries the whole sequence, which extends the previous one, so the engine reuses the KV.

Rewards. A turn in which any call is malformed (not JSON, unknown tool, bad arguments) gets
`format_penalty` once; the reward fn scores the final answer (the text of the last turn when the
model answered, "" when it was stopped still calling tools) and that reward is added to the last
turn. `step_rewards` has one entry per generated turn, credited at `turn_end_positions`.

Stop reasons (those of the env managers): "terminated" the model answered, "truncated" its answer
hit `max_tokens_per_turn`, "max_steps" `max_turns` turns all called tools, "max_tokens" the
conversation reached `max_total_tokens` (every request's max_new_tokens is capped so that the
sequence never exceeds it).

Tools reach the model through the chat template's `tools=` argument when the template uses it
(Qwen2.5/3, Llama 3.1 ...). A template that ignores it (the tiny model's) gets the tool schemas
and the call format in the system message instead (`TOOLS_SYSTEM_PROMPT`).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from roll.agentic.agent_loop.base import (
    AgentLoop,
    continuation_ids,
    encode,
    render_text,
)
from roll.agentic.agent_loop.registry import register
from roll.agentic.agent_loop.tools import MALFORMED, ToolResult, parse_tool_calls, run_tool_calls, tool_map
from roll.agentic.episode import EpisodeSpec, TokenLedger
from roll.core.enums import StopReason
from roll.core.records import Trajectory

TOOLS_SYSTEM_PROMPT = (
    "You may call tools. For each call write "
    '<tool_call>{{"name": <tool name>, "arguments": <arguments object>}}</tool_call>; '
    "answer without a tool call when you are done. Tools:\n{schemas}"
)


def prompt_ids_with_tools(tokenizer, messages: list[dict], schemas: list[dict]) -> list[int]:
    """The prompt with the tool schemas: through the template when it renders them, else in the
    system message (a template that ignores `tools=` renders the same text without)."""
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


@register("tool_agent")
class ToolAgent(AgentLoop):
    defaults = {
        **AgentLoop.defaults,
        "tools": [],  # callables or "package.module:function" paths
        "max_turns": 8,  # generated turns per episode
        "max_total_tokens": 4096,  # the whole sequence: prompt, turns and tool results
        "tool_timeout_s": 30.0,  # per call; null = unbounded
        "format_penalty": -0.1,  # added once to a turn with a malformed call
        "max_tool_response_chars": 4096,  # a longer tool result is cut (and says so)
    }

    def __init__(self, cfg, client, tokenizer):
        super().__init__(cfg, client, tokenizer)
        self.tools = tool_map(self.cfg.tools)
        self.schemas = [tool.schema for tool in self.tools.values()]

    def first_prompt_ids(self, messages: list[dict]) -> list[int]:
        return prompt_ids_with_tools(self.tokenizer, messages, self.schemas)

    def tool_messages(self, results: list[ToolResult]) -> list[dict]:
        limit = self.cfg.max_tool_response_chars
        messages = []
        for r in results:
            content = r.content if limit is None or len(r.content) <= limit else r.content[:limit] + " ...(truncated)"
            messages.append({"role": "tool", "name": r.name, "content": content})
        return messages

    async def rollout(self, episode: EpisodeSpec, row: dict[str, Any]) -> Trajectory:
        cfg = self.cfg
        ledger = TokenLedger(self.first_prompt_ids(self.initial_messages(row)))
        counts: Counter[str] = Counter()
        stop_reason, answer, num_valid = StopReason.MAX_STEPS, "", 0
        for turn in range(cfg.max_turns):
            room = cfg.max_total_tokens - len(ledger.token_ids)
            if room <= 0:
                stop_reason = StopReason.MAX_TOKENS
                break
            out = await self.generate(episode, turn, ledger.token_ids, min(cfg.max_tokens_per_turn, room))
            ledger.add_turn(out)
            text = self.decode(out.token_ids)
            calls = parse_tool_calls(text)
            if not calls:  # the final answer
                answer, num_valid = text, num_valid + 1
                stop_reason = StopReason.of_answer(out.finish_reason)
                break
            results = await run_tool_calls(calls, self.tools, cfg.tool_timeout_s)
            counts.update(r.status for r in results)
            if any(r.malformed for r in results):
                ledger.step_rewards[-1] += float(cfg.format_penalty)
            else:
                num_valid += 1
            if turn + 1 == cfg.max_turns:
                break  # no turn left to read the results
            ids = continuation_ids(self.tokenizer, self.tool_messages(results), out)
            if len(ledger.token_ids) + len(ids) >= cfg.max_total_tokens:
                stop_reason = StopReason.MAX_TOKENS  # no room left to generate after the results
                break
            ledger.add_context(ids)
        reward = await self.reward(row, answer) if ledger.num_turns else 0.0
        if ledger.num_turns:
            ledger.step_rewards[-1] += reward
        metrics = {
            "tool_calls": sum(counts.values()),
            "malformed_tool_calls": sum(counts[s] for s in MALFORMED),
            "tool_errors": counts["error"],
            "tool_timeouts": counts["timeout"],
        }
        success = bool(ledger.num_turns) and reward >= cfg.success_reward
        return self.trajectory(
            episode, ledger, success=success, stop_reason=stop_reason, num_valid_actions=num_valid, metrics=metrics
        )
