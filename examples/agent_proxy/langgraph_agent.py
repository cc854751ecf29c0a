"""Bring your own agent (2 of 2): a LangGraph agent with a `langchain-openai` chat model, trained
unchanged through `base_url`.

`build_graph(llm, env)` is the agent: a LangGraph state graph of two nodes, `policy` (the chat
model answers the conversation) and `env` (the answer is the move; the new grid comes back as the
next human message), looping until the env ends the episode. Nothing in it knows about training:
`LangGraphAgentRunner.run_job` only builds `ChatOpenAI(base_url=<proxy>, api_key=<episode token>)`
and reads the rewards the graph collected. Needs `pip install -e ".[proxy-agents]"`.

Train it: agent_val_frozen_lake_byo.yaml with `agent_runner_cls:
examples.agent_proxy.langgraph_agent.LangGraphAgentRunner`.
"""

from __future__ import annotations

import operator
from typing import Annotated, TypedDict

from langchain_core.messages import AnyMessage, HumanMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from roll.agentic.env.registry import make_env
from roll.agentic.proxy.runner import AgentRunner, EpisodeResult


class Episode(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    rewards: Annotated[list[float], operator.add]
    done: bool
    success: bool


def build_graph(llm: ChatOpenAI, env, max_turns: int):
    """policy -> env -> policy ... -> END (the env ended the episode, or `max_turns` moves)."""

    def policy(state: Episode) -> dict:
        return {"messages": [llm.invoke(state["messages"])]}

    def act(state: Episode) -> dict:
        observation, reward, terminated, truncated, info = env.step(str(state["messages"][-1].content))
        done = terminated or truncated or len(state["rewards"]) + 1 >= max_turns
        update = {"rewards": [float(reward)], "done": done, "success": bool(info.get("success", False))}
        return update if done else {**update, "messages": [HumanMessage(observation)]}

    graph = StateGraph(Episode)
    graph.add_node("policy", policy)
    graph.add_node("env", act)
    graph.add_edge(START, "policy")
    graph.add_edge("policy", "env")
    graph.add_conditional_edges("env", lambda s: END if s["done"] else "policy")
    return graph.compile()


class LangGraphAgentRunner(AgentRunner):
    """The graph as a roll runner."""

    def __init__(self, base_url: str, env_id, env_config: dict, **kwargs):
        super().__init__(base_url, env_id, env_config, **kwargs)
        self.env = make_env(self.env_config["env_type"], dict(self.env_config.get("env_config") or {}))
        self.max_turns = int(self.env_config["max_steps"])

    def run_job(self, seed: int) -> EpisodeResult:
        llm = ChatOpenAI(
            model=self.model, base_url=f"{self.base_url}/v1", api_key=self.api_key, max_tokens=1, max_retries=0
        )
        observation, _ = self.env.reset(seed=seed)
        start = {"messages": [HumanMessage(observation)], "rewards": [], "done": False, "success": False}
        final = build_graph(llm, self.env, self.max_turns).invoke(start, {"recursion_limit": 4 * self.max_turns + 4})
        return EpisodeResult(score=sum(final["rewards"]), step_scores=final["rewards"], success=final["success"])

    def teardown(self) -> None:
        self.env.close()
