"""What every env manager shares: its env, the chat bookkeeping, generate and env.step calls.

An env manager owns one env and plays one episode at a time; many managers run concurrently as
coroutines inside an env-worker actor, so while one waits on its env or on the engine the others
make progress. Subclasses decide only how an episode becomes training samples.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Awaitable, Callable

from roll.agentic.env.registry import make_env
from roll.agentic.env_manager.chat import ChatFormatter
from roll.agentic.rollout.records import GenerateOutput, GenerateRequest, SamplingParams

GenerateFn = Callable[[GenerateRequest], Awaitable[GenerateOutput]]


@dataclass(frozen=True)
class EnvSpec:
    """One env tag's settings as plain values (built from `custom_envs.<tag>` at the edge)."""

    tag: str
    env_type: str
    env_config: dict
    max_steps: int  # actions per trajectory
    max_tokens_per_step: int
    response_prefix: str = ""


@dataclass(frozen=True)
class EpisodeSpec:
    """Which episode to play: the env seed (shared by a group) and the sampling seed (per member)."""

    traj_group_id: str
    traj_id: str
    env_seed: int
    sample_seed: int
    keep_frames: bool = False


class EnvStepTimeout(RuntimeError):
    pass


class BaseEnvManager:
    def __init__(self, spec: EnvSpec, tokenizer, generate: GenerateFn, sampling: SamplingParams,
                 sequence_length: int, step_timeout_s: float | None = 60.0):
        self.spec = spec
        self.env = make_env(spec.env_type, dict(spec.env_config))
        self.chat = ChatFormatter(tokenizer, spec.response_prefix)
        self._generate = generate
        self.sampling = dataclasses.replace(sampling, max_new_tokens=spec.max_tokens_per_step)
        self.sequence_length = sequence_length
        self.step_timeout_s = step_timeout_s

    async def generate(self, request_id: str, prompt_ids: list[int], seed: int) -> GenerateOutput:
        return await self._generate(GenerateRequest(request_id, list(prompt_ids), self.sampling, seed))

    async def env_step(self, text: str):
        """env.step in a thread, so a slow env does not block the other managers; bounded in time."""
        try:
            return await asyncio.wait_for(asyncio.to_thread(self.env.step, text), self.step_timeout_s)
        except asyncio.TimeoutError:
            raise EnvStepTimeout(f"env.step exceeded {self.step_timeout_s}s") from None

    def render_frame(self) -> str:
        frame = self.env.render() if getattr(self.env, "render_mode", None) == "ansi" else None
        return frame if isinstance(frame, str) else ""
