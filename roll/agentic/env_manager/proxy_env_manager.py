"""`ProxyEnvManager`: an episode played by an agent runner through the chat proxy.

ROLL's ProxyEnvManager (roll/pipeline/agentic/env_manager/proxy_env_manager.py) with our parts: the
manager does not play the env itself. For each episode it opens a live episode on its env
worker's `ProxyServer` (a fresh bearer token), hands the token to its runner and calls
`run_job(env_seed)` (in a thread of its own for a plain function, awaited for a coroutine), then
closes the episode and turns the recorded calls into the same `Trajectory` the other managers
produce: trajectory-wise (`SampleMode.TRAJ`: the longest chain of calls as one sequence) or
step-wise (`SampleMode.STEP`: one sample per call), with the runner's rewards spread over the
turns (`recorder.spread_rewards`).

An episode is dropped (the env worker counts it and renews the manager) when the runner does not
return within `episode_timeout_s` (its thread cannot be killed: the token is revoked, so its
next call is refused, and the runner is replaced, never reused), when its result's status is not
"Finished", when it never called the model, or when an answer never reached it (its client closed
the connection first: the proxy's `cut_off`, named with what the runner did next). An engine
failure seen by the proxy is re-raised: it stops the run like any engine failure.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import threading

from roll.agentic.episode import EnvSpec, EpisodeSpec
from roll.agentic.generation import GenerateFn
from roll.agentic.proxy.recorder import spread_rewards
from roll.agentic.proxy.runner import FINISHED, AgentRunner, EpisodeResult
from roll.agentic.proxy.server import ProxyServer
from roll.agentic.proxy.session import ProxyEpisode
from roll.core.enums import SampleMode, StopReason
from roll.core.errors import engine_failure
from roll.core.imports import import_object
from roll.core.records import SamplingParams, Trajectory

ROLL_RUNNERS = {
    "roll.pipeline.agentic.agent_runner.gem_runner.GEMRunner": "roll.agentic.proxy.runners:GEMRunner",
    "roll.pipeline.agentic.agent_runner.gem_runner.ToolCallRunner": "roll.agentic.proxy.runners:ToolCallRunner",
}
"""ROLL's runner class paths -> ours."""
CUT_OFF_SETTLE_S = 5.0
"""How long a runner that raised waits for the server to finish its calls (and see a closed
connection) before the episode's cause is chosen."""


class EpisodeFailed(RuntimeError):
    """The runner timed out, failed, or never called the model: the episode is dropped."""


def runner_class(path: str) -> type[AgentRunner]:
    """The runner class of `agent_runner_cls`: ROLL's path (mapped), `pkg.mod:Class` or `pkg.mod.Class`."""
    path = ROLL_RUNNERS.get(path, path)
    if ":" not in path:
        module, _, name = path.rpartition(".")
        path = f"{module}:{name}"
    return import_object(path)


class ProxyEnvManager:
    """See the module docstring; the interface of `BaseEnvManager` that `EnvWorker` uses."""

    reuse_kv_across_turns = True  # a conversation's calls share the engine session (its traj_id)

    def __init__(
        self,
        spec: EnvSpec,
        tokenizer,
        generate: GenerateFn,
        sampling: SamplingParams,
        sequence_length: int,
        *,
        server: ProxyServer,
        mode: SampleMode = SampleMode.TRAJ,
        env_id: int | str = 0,
        episode_timeout_s: float | None = 600.0,
        generate_timeout_s: float | None = 300.0,
    ):
        self.spec = spec
        self.tokenizer = tokenizer
        self._generate = generate
        # as in ROLL: min(max_tokens_per_step, generating_args.max_new_tokens) per call
        self.sampling = dataclasses.replace(
            sampling, max_new_tokens=min(spec.max_tokens_per_step, sampling.max_new_tokens)
        )
        self.sequence_length = sequence_length
        self.server = server
        self.mode = SampleMode(mode)
        self.env_id = env_id
        self.episode_timeout_s = episode_timeout_s
        self.generate_timeout_s = generate_timeout_s
        self.runner: AgentRunner | None = None

    def runner_config(self) -> dict:
        s = self.spec
        return {
            "tag": s.tag,
            "env_type": s.env_type,
            "env_config": dict(s.env_config),
            "max_steps": s.max_steps,
            "max_tokens_per_step": s.max_tokens_per_step,
            "agent_system_template": s.agent_system_template,
            "agent_template": s.agent_template,
            "instruction": s.instruction,
            "model": min(self.server.model_names),
        }

    async def run_episode(self, episode: EpisodeSpec) -> Trajectory:
        base_url = await self.server.start()
        runner = self.runner
        if runner is None:
            assert self.spec.agent_runner_cls is not None  # the env worker makes this manager only then
            cls = runner_class(self.spec.agent_runner_cls)
            runner = self.runner = await asyncio.to_thread(
                cls, base_url=base_url, env_id=self.env_id, env_config=self.runner_config()
            )
        live = self.server.open_episode(
            episode.traj_id,
            sample_seed=episode.sample_seed,
            tokenizer=self.tokenizer,
            generate=self._generate,
            sampling=self.sampling,
            sequence_length=self.sequence_length,
            generate_timeout_s=self.generate_timeout_s,
        )
        runner.api_key = live.token
        try:
            result = await asyncio.wait_for(self._run_job(runner, episode.env_seed), self.episode_timeout_s)
        except TimeoutError:
            raise EpisodeFailed(
                f"episode timeout: the runner did not return within {self.episode_timeout_s}s "
                f"({live.requests} requests served)"
            ) from None
        except Exception as err:
            await live.wait_idle(CUT_OFF_SETTLE_S)
            if live.cut_off is None:
                raise
            raise EpisodeFailed(f"{live.cut_off}; then the runner raised {type(err).__name__}: {err}") from None
        finally:
            self.server.close_episode(live)
        failure = engine_failure(live.failure) if live.failure is not None else None
        if failure is not None:
            raise failure
        if live.cut_off is not None:
            raise EpisodeFailed(f"{live.cut_off}; the runner went on and finished")
        return self.trajectory(episode, live, result)

    @staticmethod
    async def _run_job(runner: AgentRunner, seed: int) -> EpisodeResult:
        if inspect.iscoroutinefunction(runner.run_job):
            return await runner.run_job(seed)
        return await _in_own_thread(runner.run_job, seed)

    def trajectory(self, episode: EpisodeSpec, live: ProxyEpisode, result: EpisodeResult) -> Trajectory:
        if not isinstance(result, EpisodeResult):
            raise EpisodeFailed(f"run_job returned {type(result).__name__}, not an EpisodeResult")
        if result.status != FINISHED:
            raise EpisodeFailed(f"runner status {result.status!r}: {result.agent_exit_reason or 'no reason given'}")
        recorder = live.recorder
        if not recorder.calls:
            raise EpisodeFailed("the runner finished without calling the model")
        calls = recorder.calls if self.mode == SampleMode.STEP else recorder.main_chain()
        rewards = spread_rewards(result.score, result.step_scores, len(calls))
        fields = recorder.step_fields(rewards) if self.mode == SampleMode.STEP else recorder.trajectory_fields(rewards)
        if episode.keep_frames:
            fields.update(recorder.frames(calls, rewards))
        default_stop = StopReason.MAX_TOKENS if live.out_of_tokens else StopReason.TERMINATED
        metrics = {k: float(v) for k, v in result.metrics.items()}
        metrics.update(
            {
                "proxy/requests": float(live.requests),
                "proxy/generations": float(len(recorder.calls)),
                "proxy/forks": float(recorder.forks),
                "proxy/overhead_ms_per_request": 1e3 * live.overhead_s / max(live.requests, 1),
            }
        )
        return Trajectory(
            tag=self.spec.tag,
            traj_group_id=episode.traj_group_id,
            traj_id=episode.traj_id,
            env_seed=episode.env_seed,
            step_rewards=rewards,
            success=bool(result.score > 0) if result.success is None else bool(result.success),
            stop_reason=StopReason(result.stop_reason) if result.stop_reason else default_stop,
            policy_version=max(fields["policy_versions"]),
            num_actions=len(result.step_scores) or len(rewards),
            num_valid_actions=len(result.step_scores) or len(rewards),
            metrics=metrics,
            **fields,
        )

    def close(self) -> None:
        """Tear the runner down (in the background: a hung runner may hold its env) and forget it."""
        runner, self.runner = self.runner, None
        if runner is not None:
            threading.Thread(target=runner.teardown, daemon=True, name="runner-teardown").start()


def _in_own_thread(fn, *args) -> asyncio.Future:
    """`fn(*args)` in a fresh daemon thread: a runner that blocks past its timeout holds only its
    own thread, never a pool worker other episodes need."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(result, error):
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(result)

    def target():
        try:
            result, error = fn(*args), None
        except BaseException as e:  # handed to the awaiting loop
            result, error = None, e
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop closed meanwhile
            pass

    threading.Thread(target=target, daemon=True, name="agent-runner").start()
    return future
