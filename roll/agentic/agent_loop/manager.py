"""`AgentManager`: an agent loop hosted by an env worker like an env manager.

`EnvWorker` plays groups by calling `run_episode(EpisodeSpec)` on its managers; for a tag with
`env_type: agent` those managers are `AgentManager`s. Each picks the row of its episode's env seed
from the dataset, builds the row's agent (once per (agent_name, agent_cfg_path) per worker, held
by the worker's `AgentPool`) and awaits `agent.run(**row)`. An agent that raises drops one
trajectory, exactly as a crashing env does (the worker catches it).

The agents' client is the worker's generate function, wrapped so that each request (a) is bounded
by the manager's `generate_timeout_s` and (b) carries the env manager's stop tokens. The env
manager's sampling settings (`actor_infer.generating_args`, the manager's `generating_args`) and
the env's limits become the agent's defaults: a key the agent config sets wins.

    agent cfg key          default from
    temperature, top_p,    the manager's sampling params
    top_k, do_sample
    max_tokens_per_turn    custom_envs.<Tag>.max_tokens_per_step
    max_turns              custom_envs.<Tag>.max_steps
    max_total_tokens       sequence_length
"""

from __future__ import annotations

import dataclasses
from typing import Any

from roll.agentic.agent_loop.dataset import load_agent_dataset
from roll.agentic.agent_loop.registry import get_agent_class, load_agent_cfg
from roll.agentic.episode import EnvSpec, EpisodeSpec
from roll.agentic.generation import GenerateFn, generate_within
from roll.core.records import GenerateOutput, GenerateRequest, SamplingParams, Trajectory


class BoundedClient:
    """The worker's generate function as an agent client: a timeout per request and the
    manager's stop tokens added to requests that set none."""

    def __init__(self, generate: GenerateFn, stop_token_ids: list[int], timeout_s: float | None):
        self._generate = generate
        self.stop_token_ids = list(stop_token_ids)
        self.timeout_s = timeout_s

    async def generate(self, request: GenerateRequest) -> GenerateOutput:
        if self.stop_token_ids and not request.params.stop_token_ids:
            request = dataclasses.replace(
                request, params=dataclasses.replace(request.params, stop_token_ids=list(self.stop_token_ids))
            )
        return await generate_within(self._generate, request, self.timeout_s)


class AgentPool:
    """The agents of one env worker, built on first use and shared by its managers (an agent holds
    no per-episode state: `run` keeps everything in locals)."""

    def __init__(
        self,
        tokenizer,
        generate: GenerateFn,
        sampling: SamplingParams,
        sequence_length: int,
        generate_timeout_s: float | None,
    ):
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.sequence_length = sequence_length
        self.client = BoundedClient(generate, sampling.stop_token_ids, generate_timeout_s)
        self._agents: dict[tuple[str, str, int, int], Any] = {}

    def agent(self, name: str, cfg_path: str, spec: EnvSpec):
        key = (name, cfg_path, spec.max_steps, spec.max_tokens_per_step)
        if key not in self._agents:
            cls = get_agent_class(name)
            given = dict(load_agent_cfg(cfg_path)) if cfg_path else {}
            self._agents[key] = cls({**self.defaults_for(cls, spec), **given}, self.client, self.tokenizer)
        return self._agents[key]

    def defaults_for(self, cls: type, spec: EnvSpec) -> dict[str, Any]:
        """The manager's settings for the keys the agent class reads (see the module docstring)."""
        s = self.sampling
        inherited = {
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k,
            "do_sample": s.do_sample,
            "max_tokens_per_turn": spec.max_tokens_per_step,
            "max_turns": spec.max_steps,
            "max_total_tokens": self.sequence_length,
        }
        accepted = getattr(cls, "defaults", {})
        return {k: v for k, v in inherited.items() if k in accepted}


class AgentManager:
    """Plays dataset rows with agent loops; the interface of `BaseEnvManager` that `EnvWorker` uses."""

    # Agents send the whole conversation each turn with the trajectory id as session id.
    reuse_kv_across_turns = True

    def __init__(self, spec: EnvSpec, pool: AgentPool):
        self.spec = spec
        self.pool = pool
        self.dataset = load_agent_dataset(spec.env_config)

    async def run_episode(self, episode: EpisodeSpec) -> Trajectory:
        row = self.dataset.row_for_seed(episode.env_seed)
        agent = self.pool.agent(row["agent_name"], row["agent_cfg_path"], self.spec)
        row.update(
            tag=self.spec.tag,
            traj_group_id=episode.traj_group_id,
            traj_id=episode.traj_id,
            env_seed=episode.env_seed,
            sample_seed=episode.sample_seed,
        )
        return await agent.run(**row)

    def close(self) -> None:
        """Nothing to release: the agent and its tools are shared by the worker's managers."""
