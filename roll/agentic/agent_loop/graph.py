"""`AgentGraph`: an agent whose rollout logic is a LangGraph graph (the ChatLearn / verl way of
plugging LangGraph agents into RL training).

A subclass implements `build_graph()`: a compiled graph over `MessagesState` that calls `self.llm`,
a `RollChatModel` made for the episode being played. `run(**row)` builds the graph on a per-episode
copy of the agent (so one agent object can play many episodes concurrently), invokes it on the
row's messages, and hands back the `Trajectory` held by the model's ledger of the conversation that
produced the final message: its ids are exactly those the engine generated plus the continuation
ids of tool / user messages (see `langchain_model`). Turns generated on other branches (a graph
that rewrote history, or explored side branches) are not in it; `metrics` counts them
(`retemplated_turns`, `dropped_turns`).

Rewards and stop reasons follow `ToolAgent`: malformed calls cost their turn `format_penalty`; the
reward fn scores the final answer (the last message when the model answered, "" when it was
stopped still calling tools) and is added to the last turn; stop reasons are "terminated",
"truncated", "max_steps" and "max_tokens".

`route_after_agent` and `report_invalid_tool_calls` are the pieces every ReAct graph here needs:
LangGraph's `tools_condition` ends the episode on a turn whose calls were all malformed, and
`ToolNode` never answers `invalid_tool_calls`, so the model would not learn why its call failed.
"""

from __future__ import annotations

import copy
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langgraph.errors import GraphRecursionError
from langgraph.graph import END, MessagesState

from roll.agentic.agent_loop.base import AgentLoop
from roll.agentic.agent_loop.langchain_model import RollChatModel, message_text
from roll.agentic.episode import EpisodeSpec, TokenLedger
from roll.core.enums import StopReason
from roll.core.records import Trajectory

_MESSAGE = {"system": SystemMessage, "user": HumanMessage, "assistant": AIMessage}


def to_langchain(messages: list[dict]) -> list[BaseMessage]:
    """Chat-template dicts (a row's prompt) as LangChain messages."""
    return [_MESSAGE[m["role"]](content=m["content"]) for m in messages]


def route_after_agent(state: MessagesState) -> str:
    """After the model's turn: "invalid" when a call was malformed (reported first), "tools" when
    it called tools, else the episode ends."""
    last = state["messages"][-1]
    if isinstance(last, AIMessage) and last.invalid_tool_calls:
        return "invalid"
    if isinstance(last, AIMessage) and last.tool_calls:
        return "tools"
    return END


def route_after_invalid(state: MessagesState) -> str:
    """After the error reports: run the turn's valid calls too, if any, else back to the model."""
    turn = next(m for m in reversed(state["messages"]) if isinstance(m, AIMessage))
    return "tools" if turn.tool_calls else "agent"


def report_invalid_tool_calls(state: MessagesState) -> dict[str, list[ToolMessage]]:
    """One error ToolMessage per malformed call of the last turn, which the model reads next."""
    last = state["messages"][-1]
    assert isinstance(last, AIMessage)  # route_after_agent sends only a turn with malformed calls here
    return {
        "messages": [
            ToolMessage(
                content=f"Error: {c['error']}", tool_call_id=c["id"] or "", name=c["name"] or "?", status="error"
            )
            for c in last.invalid_tool_calls
        ]
    }


class AgentGraph(AgentLoop):
    """Base of LangGraph agents: implement `build_graph()` with `self.llm`."""

    defaults = {
        **AgentLoop.defaults,
        "max_turns": 8,  # generated turns per episode (over all branches)
        "max_total_tokens": 4096,  # the whole sequence: prompt, turns and tool results
        "format_penalty": -0.1,  # added once to a turn with a malformed tool call
    }
    llm: RollChatModel

    def build_graph(self) -> Any:
        """A compiled StateGraph over `MessagesState` whose model node calls `self.llm`."""
        raise NotImplementedError

    def make_llm(self, episode: EpisodeSpec) -> RollChatModel:
        async def generate(turn: int, prompt_ids: list[int], max_new_tokens: int):
            return await self.generate(episode, turn, prompt_ids, max_new_tokens)

        return RollChatModel(
            generate_fn=generate,
            tokenizer=self.tokenizer,
            max_turns=int(self.cfg.max_turns),
            max_tokens_per_turn=int(self.cfg.max_tokens_per_turn),
            max_total_tokens=int(self.cfg.max_total_tokens),
            format_penalty=float(self.cfg.format_penalty),
        )

    async def rollout(self, episode: EpisodeSpec, row: dict[str, Any]) -> Trajectory:
        bound = copy.copy(self)  # self.llm belongs to this episode only
        bound.llm = self.make_llm(episode)
        graph = bound.build_graph()
        # each turn visits at most 3 nodes (agent, invalid, tools); the model refuses past max_turns
        config = {"recursion_limit": 3 * int(self.cfg.max_turns) + 4}
        try:
            state = await graph.ainvoke({"messages": to_langchain(self.initial_messages(row))}, config)
            messages = state["messages"]
        except GraphRecursionError:  # a graph that loops without calling the model
            messages = []
        return await self.finish(episode, row, bound.llm, messages)

    async def finish(
        self, episode: EpisodeSpec, row: dict[str, Any], llm: RollChatModel, messages: list[BaseMessage]
    ) -> Trajectory:
        """The trajectory of the conversation that produced the final message, with its reward."""
        final = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
        meta = final.response_metadata if final is not None else {}
        conv = llm.conversation(meta.get("conversation"))
        ledger = conv.ledger if conv is not None else TokenLedger([])
        stop_reason = meta.get("stop_reason", StopReason.MAX_STEPS)
        if stop_reason == "tool_calls":  # the graph ended while the model was calling tools
            stop_reason = StopReason.MAX_STEPS
        answered = final is not None and stop_reason in (StopReason.TERMINATED, StopReason.TRUNCATED)
        answer = message_text(final) if final is not None and answered else ""
        reward = await self.reward(row, answer) if ledger.num_turns else 0.0
        if ledger.num_turns:
            ledger.step_rewards[-1] += reward
        called = {c["id"] for m in messages if isinstance(m, AIMessage) for c in m.tool_calls}
        model_metrics = llm.metrics()
        metrics = {
            "tool_calls": conv.tool_calls if conv else 0,
            "malformed_tool_calls": conv.malformed_tool_calls if conv else 0,
            "tool_errors": sum(
                isinstance(m, ToolMessage) and m.status == "error" and m.tool_call_id in called for m in messages
            ),
            "retemplated_turns": model_metrics["retemplated_turns"],
            "dropped_turns": model_metrics["generated_turns"] - ledger.num_turns,
        }
        success = bool(ledger.num_turns) and reward >= self.cfg.success_reward
        return self.trajectory(
            episode,
            ledger,
            success=success,
            stop_reason=stop_reason,
            num_valid_actions=conv.num_valid if conv else 0,
            metrics=metrics,
        )
