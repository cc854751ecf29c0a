"""Agent loops: tool-calling agents and user-written agents trained through the same pipeline as
env managers. Importing the package registers the built-in agents ("single_turn", "tool_agent", and
"math_graph", imported on first use: it needs LangGraph, `pip install -e ".[agents]"`)."""

from roll.agentic.agent_loop.base import AgentLoop, SingleTurnAgent
from roll.agentic.agent_loop.registry import get_agent_class, list_agents, load_agent_cfg, make_agent, register
from roll.agentic.agent_loop.tool_agent import ToolAgent
from roll.agentic.agent_loop.tools import Tool, ToolCall, ToolResult, parse_tool_calls, run_tool_calls
from roll.agentic.episode import EpisodeSpec, TokenLedger  # the ledger agents share with env managers

__all__ = [
    "AgentLoop",
    "EpisodeSpec",
    "SingleTurnAgent",
    "TokenLedger",
    "ToolAgent",
    "Tool",
    "ToolCall",
    "ToolResult",
    "get_agent_class",
    "list_agents",
    "load_agent_cfg",
    "make_agent",
    "parse_tool_calls",
    "register",
    "run_tool_calls",
]
