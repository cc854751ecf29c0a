"""Bring your own agent (1 of 2): an agent written against the real `openai` client, trained unchanged.

`play` is the agent: production code that knows nothing of training. It gets an `openai.OpenAI`
client, a model name and an env, and plays one episode by chat completions. `OpenAIAgentRunner`
is all the glue roll needs (docs/agent_proxy.md): `run_job(seed)` hands `play` a client whose
`base_url` is the proxy and whose `api_key` is the episode's token, and reports the env's rewards.

Train it (YAML: agent_val_frozen_lake_byo.yaml, `agent_runner_cls:
examples.agent_proxy.openai_agent.OpenAIAgentRunner`, with the repository on PYTHONPATH):

    bash examples/agent_proxy/run_agentic_pipeline_agent_runner.sh --config_name agent_val_frozen_lake_byo

Run the same agent against any OpenAI-compatible server (what production does):

    python examples/agent_proxy/openai_agent.py --base_url http://127.0.0.1:8000/v1 --model my-model
"""

from __future__ import annotations

import argparse

import openai

from roll.agentic.env.registry import make_env
from roll.agentic.proxy.runner import AgentRunner, EpisodeResult


def play(client: openai.OpenAI, model: str, env, seed: int, max_turns: int = 8) -> tuple[list[float], bool]:
    """One FrozenLake episode: show the grid, take the answer as the move, until the env ends it."""
    observation, info = env.reset(seed=seed)
    messages = [{"role": "user", "content": observation}]
    rewards: list[float] = []
    for _ in range(max_turns):
        answer = client.chat.completions.create(model=model, messages=messages, max_tokens=1).choices[0].message
        observation, reward, terminated, truncated, info = env.step(answer.content or "")
        rewards.append(float(reward))
        if terminated or truncated:
            break
        messages += [{"role": "assistant", "content": answer.content or ""}, {"role": "user", "content": observation}]
    return rewards, bool(info.get("success", False))


class OpenAIAgentRunner(AgentRunner):
    """`play` as a roll runner: the env of the tag, the proxy's client, the env's rewards."""

    def __init__(self, base_url: str, env_id, env_config: dict, **kwargs):
        super().__init__(base_url, env_id, env_config, **kwargs)
        self.env = make_env(self.env_config["env_type"], dict(self.env_config.get("env_config") or {}))

    def run_job(self, seed: int) -> EpisodeResult:
        rewards, success = play(self.client(), self.model, self.env, seed, int(self.env_config["max_steps"]))
        return EpisodeResult(score=sum(rewards), step_scores=rewards, success=success)

    def teardown(self) -> None:
        self.env.close()


if __name__ == "__main__":
    import envs  # noqa: F401  (registers the built-in envs)

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base_url", required=True)
    parser.add_argument("--api_key", default="none")
    parser.add_argument("--model", required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key)
    rewards, success = play(client, args.model, make_env("frozen_lake", {}), args.seed)
    print(f"rewards {rewards}, success {success}")
