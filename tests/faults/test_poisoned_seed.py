"""Fault (our own pick): an env whose `reset` raises for one seed, every time (a broken level in a
task set). A real `EnvWorker` on the tiny model's real inference worker plays a group of that seed:
every member is dropped with the env's own exception as the cause (all members share the seed), and
the worker is not harmed: the next group, another seed, plays in full on the same envs. In training
the scheduler replaces an all-dropped group by a fresh group index, hence a fresh seed (at most
max(8, 2 x groups) a step, then `RolloutFailed` names the last causes), so the run goes on and the
step's batch is whole; the drops are counted in `rollout/dropped_trajectories`. Nothing acknowledged
is lost; nothing to resume."""

from __future__ import annotations

import asyncio
import time

import envs  # noqa: F401  (registers the built-in envs)
from envs.frozen_lake.env import FrozenLakeEnv
from roll.agentic.episode import EnvSpec
from roll.agentic.rollout.env_worker import EnvWorker, GroupSpec
from roll.core.records import SamplingParams
from roll.distributed.workers.inference import InferenceWorker
from roll.models.tiny import build_tiny_model
from tests.faults.timing import detected

POISONED = 13


class BrokenLevelLake(FrozenLakeEnv):
    """FrozenLake whose level for seed 13 cannot be built."""

    def reset(self, *, seed=None, options=None):
        if seed == POISONED:
            raise ValueError(f"level {seed} is broken: no path from start to goal")
        return super().reset(seed=seed, options=options)


class _Method:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        return self.fn(*args)


class Local:
    def __init__(self, worker: InferenceWorker):
        self.generate_many = _Method(worker.generate_many)
        self.release_sessions = _Method(lambda sessions: None)


def test_a_seed_whose_reset_always_raises_drops_its_group_with_the_cause_and_the_next_group_plays(tmp_path):
    corpus = [FrozenLakeEnv.instruction, "Left Right Up Down"]
    model_dir = build_tiny_model(tmp_path / "tiny", corpus=corpus, extra_tokens=["<answer>", "</answer>"])
    spec = EnvSpec(tag="FL", env_type=f"{__name__}:BrokenLevelLake", env_config={}, max_steps=2, max_tokens_per_step=5)

    async def run():
        worker = EnvWorker(
            [spec], 2, model_dir, Local(InferenceWorker(model_dir, num_threads=1)), SamplingParams(), 4096
        )
        started = time.perf_counter()
        poisoned = await worker.run_group(0, GroupSpec(0, "train-1-0", env_seed=POISONED, sample_seed=2))
        seconds = time.perf_counter() - started
        healthy = await worker.run_group(0, GroupSpec(1, "train-1-1", env_seed=POISONED + 1, sample_seed=3))
        return poisoned, seconds, healthy

    poisoned, seconds, healthy = asyncio.run(run())
    detected("env_reset_raises_for_one_seed", seconds)
    assert poisoned.trajectories == [] and len(poisoned.dropped) == 2
    assert all(d.endswith(f"level {POISONED} is broken: no path from start to goal") for d in poisoned.dropped), (
        poisoned.dropped
    )
    assert len(healthy.trajectories) == 2 and healthy.dropped == []
