"""What every env manager shares: its env, the chat bookkeeping, generate and env.step calls.

An env manager owns one env and plays one episode at a time; many managers run concurrently as
coroutines inside an env-worker actor, so while one waits on its env or on the engine the others
make progress. Subclasses decide only how an episode becomes training samples.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from roll.agentic.env.faults import EPISODE_KEY_OPTION, FaultInjectingEnv
from roll.agentic.env.registry import make_env
from roll.agentic.env_manager.chat import ChatFormatter
from roll.agentic.env_manager.env_calls import EnvCaller, EnvStepTimeout  # noqa: F401 (EnvStepTimeout: re-exported)
from roll.agentic.episode import EnvSpec, EpisodeSpec
from roll.agentic.generation import GenerateFn, generate_within
from roll.core.enums import StopReason
from roll.core.records import (
    GenerateOutput,
    GenerateRequest,
    SamplingParams,
    Trajectory,
)
from roll.core.seeding import derive_seed


class MalformedEnvOutput(RuntimeError):
    """env.step returned something other than (str, finite number, bool, bool, dict)."""


def check_step_output(result) -> tuple[str, float, bool, bool, dict]:
    """`result` of env.step, checked: a malformed one raises instead of poisoning the batch."""
    if not (isinstance(result, tuple) and len(result) == 5):
        raise MalformedEnvOutput(f"env.step returned {type(result).__name__}, not a 5-tuple")
    obs, reward, terminated, truncated, info = result
    problems = [
        what
        for what, bad in (
            ("observation is not a str", not isinstance(obs, str)),
            ("reward is not a finite number", not (isinstance(reward, (int, float)) and math.isfinite(reward))),
            (
                "terminated/truncated are not bools",
                not all(isinstance(x, (bool, np.bool_)) for x in (terminated, truncated)),
            ),
            ("info is not a dict", not isinstance(info, dict)),
        )
        if bad
    ]
    if problems:
        raise MalformedEnvOutput("env.step output: " + "; ".join(problems))
    return obs, float(reward), bool(terminated), bool(truncated), info


class EpisodeBuilder:
    """How one episode becomes training samples; the only part a manager type defines."""

    def prompt(self) -> list[int] | None:
        """Ids to generate from this turn; None when the token budget is spent."""
        raise NotImplementedError

    def add_response(self, out: GenerateOutput, reward: float) -> None:
        raise NotImplementedError

    def add_observation(self, observation: str, out: GenerateOutput, reward: float) -> None:
        raise NotImplementedError

    def sample_fields(self) -> dict:
        """The Trajectory fields that hold the samples (token_ids... or steps)."""
        raise NotImplementedError


class BaseEnvManager:
    """Plays episodes; `run_episode` is the one loop every manager type shares."""

    # Whether each turn's prompt extends the previous turn's prompt and response, so the engine
    # can keep the conversation's KV between turns (requests then carry the trajectory id as
    # their session id). False for managers that rebuild every prompt.
    reuse_kv_across_turns: bool = False

    def new_builder(self, instruction: str | None, observation: str) -> EpisodeBuilder:
        raise NotImplementedError

    def __init__(
        self,
        spec: EnvSpec,
        tokenizer,
        generate: GenerateFn,
        sampling: SamplingParams,
        sequence_length: int,
        step_timeout_s: float | None = 60.0,
        generate_timeout_s: float | None = 300.0,
    ):
        self.spec = spec
        self.env = make_env(spec.env_type, dict(spec.env_config))
        self.chat = ChatFormatter(tokenizer, spec.response_prefix)
        self._generate = generate
        # as in ROLL: min(max_tokens_per_step, generating_args.max_new_tokens) per env step
        self.sampling = dataclasses.replace(
            sampling, max_new_tokens=min(spec.max_tokens_per_step, sampling.max_new_tokens)
        )
        self.episode_sampling = self.sampling  # the running episode's (`EpisodeSpec.temperature`)
        self.sequence_length = sequence_length
        self.env_calls = EnvCaller(
            self.env,
            tag=spec.tag,
            timeout_s=step_timeout_s,
            use_thread_lock=spec.use_thread_lock,
            max_env_step_concurrent=spec.max_env_step_concurrent,
        )
        self.generate_timeout_s = generate_timeout_s

    async def generate(
        self, request_id: str, prompt_ids: list[int], seed: int, session_id: str | None = None
    ) -> GenerateOutput:
        """One turn's generation, bounded in time (None: unbounded). A request that times out may
        still be served by the engine; its answer is then discarded, and the episode is dropped."""
        request = GenerateRequest(request_id, list(prompt_ids), self.episode_sampling, seed, session_id=session_id)
        return await generate_within(self._generate, request, self.generate_timeout_s)

    async def _env_call(self, name: str, *args, **kwargs):
        """env.<name>, bounded in time: in a thread, so a slow env does not block the other
        managers, or inline when the env declares the call cheap (`env_calls.EnvCaller`). A call
        that times out closes the env and the manager is dropped."""
        return await self.env_calls(name, *args, **kwargs)

    async def env_step(self, text: str):
        return check_step_output(await self._env_call("step", text))

    def close(self) -> None:
        """Close the env (a dropped manager's env may hold a hung thread, a server session...)."""
        self.env_calls.close()

    async def run_episode(self, episode: EpisodeSpec) -> Trajectory:
        self.episode_sampling = (
            self.sampling
            if episode.temperature is None
            else dataclasses.replace(self.sampling, temperature=episode.temperature)
        )
        # injected faults (if any) are drawn per episode, so a group's members fail independently
        options = {EPISODE_KEY_OPTION: episode.sample_seed} if isinstance(self.env, FaultInjectingEnv) else None
        obs, info = await self._env_call("reset", seed=episode.env_seed, options=options)
        instruction = info.get("env_instruction") if self.spec.instruction is None else self.spec.instruction
        builder = self.new_builder(instruction, obs)
        frames = [obs] if episode.keep_frames else []  # a text env's observation is its frame
        captions = [f"reset (seed {episode.env_seed})"] if episode.keep_frames else []
        rewards: list[float] = []
        versions: list[int] = []  # per turn: the oldest weights that generated a token of it
        newest = 0  # the newest weights that generated a token
        num_valid, success, stop_reason, info = 0, False, StopReason.MAX_STEPS, {}
        for turn in range(self.spec.max_steps):
            prompt_ids = builder.prompt()
            if prompt_ids is None:
                stop_reason = StopReason.MAX_TOKENS
                break
            out = await self.generate(
                f"{episode.traj_id}/{turn}",
                prompt_ids,
                derive_seed(episode.sample_seed, turn),
                episode.traj_id if self.reuse_kv_across_turns else None,
            )
            versions.append(out.oldest_version)
            newest = max(newest, out.policy_version)
            obs, reward, terminated, truncated, info = await self.env_step(self.chat.response_text(out.token_ids))
            rewards.append(float(reward))
            builder.add_response(out, float(reward))
            num_valid += bool(info.get("action_is_valid", True))
            success = bool(info.get("success", False))
            if episode.keep_frames:
                frames.append(obs)
                captions.append(f"{self.chat.response_text(out.token_ids)!r} -> reward {reward:g}")
            if terminated or truncated:
                stop_reason = StopReason.TERMINATED if terminated else StopReason.TRUNCATED
                break
            if turn + 1 < self.spec.max_steps:  # the observation is only needed for another turn
                builder.add_observation(obs, out, float(reward))
        return Trajectory(
            tag=self.spec.tag,
            traj_group_id=episode.traj_group_id,
            traj_id=episode.traj_id,
            env_seed=episode.env_seed,
            step_rewards=rewards,
            success=success,
            stop_reason=stop_reason,
            policy_version=newest,
            num_actions=len(rewards),
            num_valid_actions=num_valid,
            metrics={k: float(v) for k, v in (info.get("metrics") or {}).items()},
            frames=frames,
            frame_captions=captions,
            policy_versions=versions,
            **builder.sample_fields(),
        )
