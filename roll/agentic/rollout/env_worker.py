"""Env-worker actor: hosts env managers (grouped) as coroutines and plays whole groups on request."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import ray
import torch

from roll.agentic.agent_loop.dataset import AGENT_ENV_TYPE
from roll.agentic.agent_loop.manager import AgentManager, AgentPool
from roll.agentic.env_manager.base import BaseEnvManager
from roll.agentic.env_manager.factory import make_env_manager
from roll.agentic.env_manager.proxy_env_manager import ProxyEnvManager
from roll.agentic.episode import EnvSpec, EpisodeSpec
from roll.agentic.gateway import InferenceGateway
from roll.agentic.proxy.server import ProxyServer
from roll.agentic.rollout.batching_client import BatchingClient
from roll.core.enums import SampleMode
from roll.core.errors import EngineHung, engine_failure
from roll.core.records import GroupResult, SamplingParams, Trajectory
from roll.core.seeding import derive_seed
from roll.models.loading import load_processor, load_tokenizer
from roll.models.templates import apply_template


@dataclass(frozen=True)
class GroupSpec:
    """One group to play: `group_size` episodes on the same env seed, each with its own sampling seed.
    `rescue` > 0: the group's k-th rescue round (`rescue_rounds`): more episodes of the same group
    on the same env seed, with sampling seeds of their own (and `temperature`, if set: the
    `rescue_temperature`); round 0 is the group itself."""

    group_index: int
    traj_group_id: str
    env_seed: int
    sample_seed: int
    keep_frames: bool = False
    rescue: int = 0
    temperature: float | None = None

    def episode(self, member: int) -> EpisodeSpec:
        if self.rescue:
            traj_id = f"{self.traj_group_id}-r{self.rescue}-{member}"
            sample_seed = derive_seed(self.sample_seed, "rescue", self.rescue, member)
        else:
            traj_id, sample_seed = f"{self.traj_group_id}-{member}", derive_seed(self.sample_seed, member)
        return EpisodeSpec(
            traj_group_id=self.traj_group_id,
            traj_id=traj_id,
            env_seed=self.env_seed,
            sample_seed=sample_seed,
            keep_frames=self.keep_frames,
            temperature=self.temperature,
        )


class EnvWorker:
    """Ray actor (async). Slot k holds `group_size + redundancy` managers of env spec `slots[k]`;
    a group is complete when `group_size` of them have finished an episode. `inference` is the
    inference worker's handle or actor name (which a restarted env worker looks up again), or a
    list of them, one per replica."""

    def __init__(
        self,
        slots: list[EnvSpec],
        group_size: int,
        tokenizer_path: str,
        inference,
        sampling: SamplingParams,
        sequence_length: int,
        *,
        manager_type: SampleMode | str = SampleMode.TRAJ,
        history_length: int = 0,
        step_timeout_s: float | None = 60.0,
        generate_timeout_s: float | None = 300.0,
        redundancy: int = 0,
        chat_template: str | None = None,
        proxy: dict | None = None,
    ):
        torch.set_num_threads(1)  # env workers only tokenize; leave the cores to the engine
        self.group_size = group_size
        n_envs = max(1, len(slots) * (group_size + redundancy))
        asyncio.get_event_loop().set_default_executor(ThreadPoolExecutor(min(n_envs, 64)))
        self.tokenizer = apply_template(load_tokenizer(tokenizer_path), chat_template)
        # a VL model's own processor (image placeholders, pixel values) for the tags with images
        self.processor = load_processor(tokenizer_path) if any(s.vision for s in slots) else None
        replicas = inference if isinstance(inference, (list, tuple)) else [inference]
        self.inference = [ray.get_actor(r) if isinstance(r, str) else r for r in replicas]
        # One batching client per inference replica, behind a gateway: a new episode goes to the
        # least-loaded replica and all its turns to that one (its KV is there).
        self._gateway = InferenceGateway([BatchingClient(r) for r in self.inference])
        self._sampling, self._sequence_length = sampling, sequence_length
        self._step_timeout_s, self._generate_timeout_s = step_timeout_s, generate_timeout_s
        self._manager_type, self._history_length = SampleMode(manager_type), history_length
        self._agent_pool = AgentPool(self.tokenizer, self._generate, sampling, sequence_length, generate_timeout_s)
        # slots played by agent runners share one loopback chat server (`proxy`: its options,
        # `episode_timeout_s` and `ProxyServer`'s keyword arguments)
        proxy = dict(proxy or {})
        self._episode_timeout_s = proxy.pop("episode_timeout_s", 600.0)
        self._proxy = ProxyServer(**proxy) if any(s.agent_runner_cls for s in slots) else None
        self._made = 0
        self._reported = (0, 0)  # (engine calls, requests) already handed back in a GroupResult
        self.groups = [[self._make_manager(spec) for _ in range(group_size + redundancy)] for spec in slots]

    def _make_manager(self, spec: EnvSpec) -> BaseEnvManager | AgentManager | ProxyEnvManager:
        if spec.env_type == AGENT_ENV_TYPE:  # dataset rows played by agent loops (traj-wise samples)
            return AgentManager(spec, self._agent_pool)
        sampling, sequence_length, generate_timeout_s = self._sampling, self._sequence_length, self._generate_timeout_s
        if spec.agent_runner_cls:  # an agent runner plays the env through the chat proxy
            assert self._proxy is not None  # made when any slot has an agent runner
            self._made += 1
            return ProxyEnvManager(
                spec,
                self.tokenizer,
                self._generate,
                sampling,
                sequence_length,
                server=self._proxy,
                mode=self._manager_type,
                env_id=self._made - 1,
                episode_timeout_s=self._episode_timeout_s,
                generate_timeout_s=generate_timeout_s,
            )
        return make_env_manager(
            spec,
            self.tokenizer,
            self._generate,
            sampling,
            sequence_length,
            mode=self._manager_type,
            history_length=self._history_length,
            step_timeout_s=self._step_timeout_s,
            generate_timeout_s=generate_timeout_s,
            processor=self.processor,  # for the tags with image observations
        )

    async def _generate(self, request):
        return await self._gateway.generate(request)

    async def ping(self) -> bool:
        """Answered on the worker's event loop: a loop blocked by a call that never returns does
        not answer (the scheduler's probe of a group past its deadline)."""
        return True

    async def run_group(self, slot: int, group: GroupSpec) -> GroupResult:
        """Play one episode per manager of the slot; return once `group_size` have finished (or
        every one has ended). Trajectories come in member order; members still running then are
        cancelled, and they and the failed ones get a fresh env for the next group."""
        managers = self.groups[slot]
        started = time.monotonic()
        tasks = {asyncio.ensure_future(m.run_episode(group.episode(i))): i for i, m in enumerate(managers)}
        finished: dict[int, Trajectory | BaseException] = {}  # member -> its Trajectory, or the exception that ended it
        pending, completed = set(tasks), 0
        while pending and completed < self.group_size:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                finished[tasks[task]] = task.exception() or task.result()
                if task.exception() is None:
                    task.result().rollout_s = time.monotonic() - started
                completed += task.exception() is None
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for i in range(len(managers)):  # unpin every episode; the engine may drop their KV now
            self._gateway.release(group.episode(i).traj_id)
        failures = (engine_failure(res) for res in finished.values() if isinstance(res, BaseException))
        engine_error = next((f for f in failures if f is not None), None) or self._hung_engine()
        if engine_error is not None:  # not an episode's fault: the run must stop (scheduler, CLI)
            raise engine_error
        trajectories: list[Trajectory] = []
        dropped: list[str] = []
        for i in range(len(managers)):
            res = finished.get(i)
            if isinstance(res, BaseException):  # named: the env tag, the episode, the cause
                dropped.append(f"{managers[i].spec.tag} {group.episode(i).traj_id}: {type(res).__name__}: {res}")
            elif res is not None:  # finished: its env is ready for the next episode
                if len(trajectories) < self.group_size:  # several may finish at once: keep the first members
                    trajectories.append(res)
                continue
            managers[i].close()  # failed or cancelled; releases an env hung in a thread, if it can be
            managers[i] = self._make_manager(managers[i].spec)  # a fresh env for the next episode
        surplus = len(managers) - len(trajectories) - len(dropped)
        calls, requests = self._take_engine_counts()
        return GroupResult(
            group.group_index, trajectories, dropped, redundant=surplus, engine_calls=calls, engine_requests=requests
        )

    def _hung_engine(self) -> EngineHung | None:
        """The first engine that has answered none of this worker's calls for `generate_timeout_s`
        while one waited (`BatchingClient.silent_s`), as an `EngineHung`. An engine that answered
        other calls meanwhile is slow, not hung: a request over the bound drops its episode only."""
        bound = self._generate_timeout_s
        if bound is None:
            return None
        for index, client in enumerate(self._gateway.workers):
            # a request's timeout starts a hair before the client sees it: 1% slack
            if (silent := client.silent_s()) >= 0.99 * bound:
                return EngineHung(
                    f"inference engine {index} (actor_infer) answered no generate call for {silent:.3g} s "
                    f"(generate_timeout_s {bound:g}): alive but stuck; resume with resume_from_checkpoint=true "
                    "once it answers again, or raise generate_timeout_s if it is only slow"
                )
        return None

    def _take_engine_counts(self) -> tuple[int, int]:
        """Ray calls to the inference workers, and the requests they carried, since the last take."""
        clients = self._gateway.workers
        total = (sum(c.calls for c in clients), sum(c.requests for c in clients))
        delta = (total[0] - self._reported[0], total[1] - self._reported[1])
        self._reported = total
        return delta
