"""`math_graph`: a LangGraph math agent with a calculator, the shape of ChatLearn's math_eval
example: an agent node and a `ToolNode` in a loop, until the model answers without a call.

    START -> agent -> (invalid calls) -> invalid -> tools | agent
                   -> (tool calls)    -> tools -> agent
                   -> (an answer)     -> END

The calculator evaluates arithmetic by walking the `ast` of the expression (numbers, + - * / // %
**, unary signs, parentheses); anything else (names, calls, attributes) is refused, so the policy
cannot run code. The reward fn comes from the config; the default, `boxed_answer_reward`, gives 1
when the last `\\boxed{...}` (else the last number) of the answer equals the row's `answer`.
"""

from __future__ import annotations

import math
import re
from typing import Any

from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from roll.agentic.agent_loop.calculator import evaluate, format_number
from roll.agentic.agent_loop.graph import (
    AgentGraph,
    report_invalid_tool_calls,
    route_after_agent,
    route_after_invalid,
)
from roll.agentic.agent_loop.registry import register

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: numbers with + - * / // % ** and parentheses, e.g. "(2 + 3) * 4".
    """
    # roll.agentic.agent_loop.calculator does the arithmetic (ast only, bounded); its errors are
    # raised here, so that ToolNode(handle_tool_errors=True) shows them to the model.
    return format_number(evaluate(expression))


def boxed_answer_reward(row: dict[str, Any], text: str) -> float:
    """1.0 when the answer's last `\\boxed{...}` (else its last number) equals `row["answer"]`."""
    boxed = re.findall(r"\\boxed\{([^{}]*)\}", text)
    numbers = _NUMBER.findall(boxed[-1] if boxed else text)
    if not numbers:
        return 0.0
    try:
        return float(math.isclose(float(numbers[-1]), float(row["answer"]), rel_tol=1e-6, abs_tol=1e-9))
    except (TypeError, ValueError):
        return 0.0


@register("math_graph")
class MathGraphAgent(AgentGraph):
    defaults = {
        **AgentGraph.defaults,
        "reward_fn": "roll.agentic.agent_loop.math_graph:boxed_answer_reward",
        "system_prompt": "Solve the problem. Use the calculator for arithmetic. Put the final answer in \\boxed{}.",
    }

    def build_graph(self) -> Any:
        tools = [calculator]
        llm = self.llm.bind_tools(tools)

        async def agent(state: MessagesState) -> dict[str, list]:
            return {"messages": [await llm.ainvoke(state["messages"])]}

        graph = StateGraph(MessagesState)
        graph.add_node("agent", agent)
        graph.add_node("invalid", report_invalid_tool_calls)
        graph.add_node("tools", ToolNode(tools, handle_tool_errors=True))  # a tool error is shown to the model
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", route_after_agent)
        graph.add_conditional_edges("invalid", route_after_invalid)
        graph.add_edge("tools", "agent")
        return graph.compile()
