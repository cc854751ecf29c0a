"""Faults on the proxy path: an agent's client that closes its connection while its answer is being
generated (the real `openai` client, streaming, against roll's real proxy server and the tiny
model's real inference worker), and an agent runner that crashes mid-episode.

A client that leaves: the server notices the disconnect at once, cancels the request's generation
(nothing of it recorded, the episode's lock free), keeps serving, and marks the episode `cut_off`;
the env manager drops the episode with that cause and what the runner did next. A runner that
raises: the episode is dropped with the runner's exception, the runner is replaced and the next
group plays. Nothing trained was ever seen half by the agent; the run goes on, nothing to resume.

"Mid-stream" here is while the answer is generated: the proxy streams an answer in one burst once
the engine has finished it (its module docstring), so a client that leaves after the first event
has had all of them written to its socket; the server still marks a stream closed before its last
event."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import openai
import pytest

import envs  # noqa: F401  (registers the built-in envs)
from envs.frozen_lake.env import FrozenLakeEnv
from roll.agentic.episode import EnvSpec
from roll.agentic.gateway import InferenceGateway
from roll.agentic.proxy.runner import AgentRunner, EpisodeResult
from roll.agentic.proxy.server import ProxyServer
from roll.agentic.rollout.env_worker import EnvWorker, GroupSpec
from roll.core.records import SamplingParams
from roll.distributed.workers.inference import InferenceWorker
from roll.models.loading import load_tokenizer
from roll.models.tiny import build_tiny_model
from tests.faults.timing import detected

LEAVE_AFTER_S = 0.3  # the agent's client timeout, shorter than the held generation
MESSAGES = [{"role": "user", "content": "Move Left"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    corpus = [FrozenLakeEnv.instruction, "Left Right Up Down"]
    return build_tiny_model(
        tmp_path_factory.mktemp("m") / "tiny", corpus=corpus, extra_tokens=["<answer>", "</answer>"]
    )


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def on(loop, coro, timeout=120):
    return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)


class Held:
    """The gateway's generate, held for `hold_s` seconds before the engine is asked: an engine busy
    with others' requests. Counts the generations cancelled and answered."""

    def __init__(self, generate, hold_s: float):
        self._generate, self.hold_s = generate, hold_s
        self.cancelled = self.answered = 0

    async def __call__(self, request):
        try:
            await asyncio.sleep(self.hold_s)
            out = await self._generate(request)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.answered += 1
        return out


def test_a_client_that_leaves_while_its_answer_is_generated_cuts_the_episode_off_and_nothing_leaks(loop, model_dir):
    server = ProxyServer()
    base_url = on(loop, server.start())
    engine = InferenceGateway([InferenceWorker(model_dir, num_threads=1)]).generate
    held = Held(engine, hold_s=5.0)

    async def open_episode(traj_id, generate):
        return server.open_episode(
            traj_id,
            sample_seed=3,
            tokenizer=load_tokenizer(model_dir),
            generate=generate,
            sampling=SamplingParams(max_new_tokens=6),
            sequence_length=512,
        )

    async def tasks():
        return len(asyncio.all_tasks())

    try:
        before = on(loop, tasks())
        episode = on(loop, open_episode("e0", held))
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=episode.token, max_retries=0, timeout=LEAVE_AFTER_S)
        with pytest.raises(openai.APITimeoutError):
            for _ in client.chat.completions.create(model="roll-policy", messages=MESSAGES, stream=True):
                pass
        left = time.perf_counter()  # the client has closed its connection
        while episode.cut_off is None and time.perf_counter() - left < 30:
            time.sleep(0.005)
        detected("proxy_client_disconnect", time.perf_counter() - left)
        assert episode.cut_off == "the client closed its connection while its answer was generated"
        assert held.cancelled == 1 and held.answered == 0  # the generation was cancelled, not left running
        assert episode.recorder.calls == []  # nothing of it recorded, so nothing of it trained
        for _ in range(200):  # the handler's tasks end
            if on(loop, tasks()) <= before:
                break
            time.sleep(0.01)
        assert on(loop, tasks()) <= before
        # the server goes on: the same episode's lock is free, and another episode streams to the end
        assert httpx.get(f"{base_url}/health").json()["status"] == "ok"
        held.hold_s = 0.0
        again = client.with_options(timeout=60).chat.completions.create(model="roll-policy", messages=MESSAGES)
        assert again.choices[0].finish_reason in ("stop", "length") and len(episode.recorder.calls) == 1
        other = on(loop, open_episode("e1", engine))
        stream = openai.OpenAI(base_url=f"{base_url}/v1", api_key=other.token, max_retries=0, timeout=60)
        events = list(stream.chat.completions.create(model="roll-policy", messages=MESSAGES, stream=True))
        assert events[-1].choices[0].finish_reason in ("stop", "length") and other.cut_off is None
    finally:
        on(loop, server.stop())


class _Method:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        return self.fn(*args)


class SlowFirstInference:
    """A real `InferenceWorker` behind the actor-handle interface, whose first batch waits
    `hold_s` (a slow engine) before it is generated."""

    def __init__(self, engine, hold_s: float):
        self.engine, self.hold_s = engine, hold_s
        self.generate_many = _Method(self._generate_many)
        self.release_sessions = _Method(lambda sessions: None)

    async def _generate_many(self, requests):
        hold, self.hold_s = self.hold_s, 0.0
        await asyncio.sleep(hold)
        return await self.engine.generate_many(requests)


class LeavingRunner(AgentRunner):
    """Streams its first call with a client timeout shorter than the engine takes; then either
    gives up (raises) or calls again and finishes."""

    then = "raise"

    def run_job(self, seed):
        client = self.client().with_options(timeout=LEAVE_AFTER_S, max_retries=0)
        try:
            list(client.chat.completions.create(model=self.model, messages=MESSAGES, stream=True))
        except openai.APITimeoutError:
            if LeavingRunner.then == "raise":
                raise
        self.client().with_options(timeout=60).chat.completions.create(model=self.model, messages=MESSAGES)
        return EpisodeResult(score=1.0)


class CrashingRunner(AgentRunner):
    """Calls the model, then crashes (its first episode only)."""

    crashed = 0

    def run_job(self, seed):
        self.client().chat.completions.create(model=self.model, messages=MESSAGES)
        if CrashingRunner.crashed == 0:
            CrashingRunner.crashed += 1
            raise RuntimeError("agent crashed: KeyError 'board' in the agent's parser")
        return EpisodeResult(score=1.0)


def spec(runner: str) -> EnvSpec:
    return EnvSpec(
        tag="Lake",
        env_type="frozen_lake",
        env_config={"max_path_length": 8},
        max_steps=3,
        max_tokens_per_step=6,
        agent_runner_cls=f"{__name__}:{runner}",
    )


def play_two_groups(model_dir, runner: str, inference):
    """Two groups of one episode each on one env worker: the faulty one, then the next."""

    async def run():
        worker = EnvWorker([spec(runner)], 1, model_dir, inference, SamplingParams(max_new_tokens=8), 1024, proxy={})
        try:
            first = await worker.run_group(0, GroupSpec(0, "g0", env_seed=5, sample_seed=9))
            second = await worker.run_group(0, GroupSpec(1, "g1", env_seed=6, sample_seed=10))
            return first, second
        finally:
            await worker._proxy.stop()

    return asyncio.run(run())


@pytest.mark.parametrize(
    ("then", "reason"),
    [
        (
            "raise",
            "EpisodeFailed: the client closed its connection while its answer was generated; "
            "then the runner raised APITimeoutError: Request timed out.",
        ),
        (
            "go_on",
            "EpisodeFailed: the client closed its connection while its answer was generated; "
            "the runner went on and finished",
        ),
    ],
)
def test_an_episode_whose_answer_never_reached_the_agent_is_dropped_with_the_cause(
    model_dir, monkeypatch, then, reason
):
    monkeypatch.setattr(LeavingRunner, "then", then)
    inference = SlowFirstInference(InferenceWorker(model_dir, num_threads=1), hold_s=3.0)
    first, second = play_two_groups(model_dir, "LeavingRunner", inference)
    assert first.trajectories == [] and len(first.dropped) == 1 and first.dropped[0].endswith(reason), first.dropped
    assert len(second.trajectories) == 1 and second.dropped == []  # the next episode is trained


def test_a_runner_that_crashes_drops_its_episode_with_the_exception_and_is_replaced(model_dir, monkeypatch):
    monkeypatch.setattr(CrashingRunner, "crashed", 0)
    inference = SlowFirstInference(InferenceWorker(model_dir, num_threads=1), hold_s=0.0)
    started = time.perf_counter()
    first, second = play_two_groups(model_dir, "CrashingRunner", inference)
    assert first.trajectories == []
    assert len(first.dropped) == 1
    assert first.dropped[0].endswith("RuntimeError: agent crashed: KeyError 'board' in the agent's parser")
    assert len(second.trajectories) == 1 and second.dropped == []
    detected("agent_runner_crash", time.perf_counter() - started)  # an upper bound: both groups played
