"""Fault: a slow engine. A real `InferenceWorker` (the tiny model, hf engine) whose every decode
step takes 40 ms longer (`ROLL_DECODE_DELAY_MS`: an engine on a busy device) serves a real
`EnvWorker` playing FrozenLake. Within `generate_timeout_s` the group is only later: every
trajectory is played and none dropped. Over it, each request that found no answer in time drops its
trajectory with the cause `generate timeout: no answer within ...s`; a dropped trajectory was never
acknowledged (never handed to the trainer), the scheduler replaces the group and the run goes on.
The engine that stops answering altogether is the hang suite's (docs/reliability.md, Hangs)."""

from __future__ import annotations

import asyncio

import pytest

import envs  # noqa: F401  (registers the built-in envs)
from envs.frozen_lake.env import FrozenLakeEnv
from roll.agentic.episode import EnvSpec
from roll.agentic.rollout.env_worker import EnvWorker, GroupSpec
from roll.core.records import SamplingParams
from roll.distributed.strategies.engine_api import DECODE_DELAY_VAR
from roll.distributed.workers.inference import InferenceWorker
from roll.models.tiny import build_tiny_model

SPEC = EnvSpec(tag="FL", env_type="frozen_lake", env_config={}, max_steps=2, max_tokens_per_step=5)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    corpus = [FrozenLakeEnv.instruction, "Left Right Up Down"]
    return build_tiny_model(
        tmp_path_factory.mktemp("m") / "tiny", corpus=corpus, extra_tokens=["<answer>", "</answer>"]
    )


@pytest.fixture
def slow_engine(model_dir, monkeypatch):
    monkeypatch.setenv(DECODE_DELAY_VAR, "40")
    return InferenceWorker(model_dir, num_threads=1)


class _Method:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        return self.fn(*args)


class Local:
    """The actor-handle interface of the env worker's inference replica, answered in-process."""

    def __init__(self, worker: InferenceWorker):
        self.generate_many = _Method(worker.generate_many)
        self.release_sessions = _Method(lambda sessions: None)


def play(model_dir, engine, generate_timeout_s: float):
    async def run():
        worker = EnvWorker(
            [SPEC], 2, model_dir, Local(engine), SamplingParams(), 4096, generate_timeout_s=generate_timeout_s
        )
        return await worker.run_group(0, GroupSpec(0, "train-1-0", env_seed=1, sample_seed=2))

    return asyncio.run(run())


def test_a_slow_engine_within_the_bound_only_makes_the_group_later(model_dir, slow_engine, monkeypatch):
    result = play(model_dir, slow_engine, generate_timeout_s=60.0)
    assert len(result.trajectories) == 2 and result.dropped == []
    monkeypatch.delenv(DECODE_DELAY_VAR)
    fast = play(model_dir, InferenceWorker(model_dir, num_threads=1), generate_timeout_s=60.0)
    assert [t.token_ids for t in result.trajectories] == [t.token_ids for t in fast.trajectories]  # the same play
