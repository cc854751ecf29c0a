"""An env that serves a call as a coroutine (`astep` / `areset`, or a `TextEnv` writing `_aapply` /
`_areset`) is awaited in the env manager's event loop: no thread, under the timeout, which cancels
it. A subclass that overrides the sync call alone keeps it."""

import asyncio
import dataclasses
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from roll.agentic.env import TextEnv
from roll.agentic.env_manager import env_calls
from roll.agentic.env_manager.env_calls import EnvCaller, EnvStepTimeout, async_calls
from roll.agentic.env_manager.traj_env_manager import TrajEnvManager
from roll.agentic.episode import EnvSpec, EpisodeSpec
from roll.core.records import GenerateOutput, SamplingParams
from roll.models.tiny import build_tiny_tokenizer


class RemoteCounter(TextEnv):
    """Counts to `goal` by "Up" / "Down"; each move waits `delay_s` as a remote call would."""

    actions = ("Up", "Down")

    def __init__(self, delay_s: float = 0.0, goal: int = 3, gate: threading.Event | None = None):
        super().__init__()
        self.delay_s, self.goal, self.gate = delay_s, goal, gate
        self.count = 0
        self.threads: list[int] = []
        self.in_flight = 0
        self.peak = 0
        self.finished_moves = 0
        self.closed = False

    async def _areset(self, options):
        await asyncio.sleep(0)
        self.count = int(self.np_random.integers(0, 2))
        return f"count {self.count}"

    async def _aapply(self, action):
        self.threads.append(threading.get_ident())
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            while self.gate is not None and not self.gate.is_set():  # polled: any thread may open it
                await asyncio.sleep(0.001)
            await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
        self.finished_moves += 1
        self.count += 1 if action == "Up" else -1
        return f"count {self.count}", float(self.count == self.goal), self.count == self.goal, False

    @property
    def success(self):
        return self.count == self.goal

    def close(self):
        self.closed = True


class BlockingCounter(RemoteCounter):
    """A user's subclass that overrides the sync move only: the inherited `astep` would skip it."""

    def _apply(self, action):
        self.threads.append(threading.get_ident())
        self.count += 2
        return f"count {self.count}", 0.0, False, False


def _play(caller: EnvCaller, moves: list[str], seed: int = 0) -> list:
    async def play():
        out = [await caller("reset", seed=seed)]
        return out + [await caller("step", f"<answer>{move}</answer>") for move in moves]

    return asyncio.run(play())


def test_a_text_env_writing_async_hooks_is_awaited_in_the_event_loop():
    env = RemoteCounter()
    caller = EnvCaller(env)
    assert caller.coroutines == {"reset", "step"} and caller.inline == set()
    results = _play(caller, ["Up", "Up", "oops", "Down"])
    assert env.threads == [threading.get_ident()] * 3  # the unparsable answer moves nothing
    assert results[3][4]["action_is_valid"] is False and results[3][1] == env.format_penalty
    assert results[-1][4]["metrics"] == {"num_actions": 4.0, "num_invalid": 1.0}


def test_the_sync_api_of_an_async_env_plays_the_same_episode():
    moves = ["Up", "Up", "Down", "Up"]
    awaited = _play(EnvCaller(RemoteCounter()), moves, seed=5)
    env = RemoteCounter()
    plain = [env.reset(seed=5)] + [env.step(f"<answer>{move}</answer>") for move in moves]
    assert awaited == plain


def test_a_subclass_overriding_the_sync_hook_keeps_it_on_the_thread_path():
    env = BlockingCounter()
    assert type(env).astep is None and async_calls(env) == {"reset"}
    results = _play(EnvCaller(env), ["Up"])
    assert results[1][0] == f"count {env.count}" and threading.get_ident() not in env.threads


class PlainRemote:
    """Not a TextEnv: any env with `step` and a coroutine `astep` of the same class."""

    def reset(self, *, seed=None, options=None):
        return "start", {}

    def step(self, action):
        return "sync", 0.0, True, False, {}

    async def astep(self, action):
        return "awaited", 0.0, True, False, {}


class PlainOverride(PlainRemote):
    def step(self, action):
        return "override", 0.0, True, False, {}


def test_any_env_may_serve_astep_and_an_override_of_step_alone_wins():
    assert _play(EnvCaller(PlainRemote()), ["x"])[1][0] == "awaited"
    assert async_calls(PlainOverride()) == frozenset()
    assert _play(EnvCaller(PlainOverride()), ["x"])[1][0] == "override"


def test_an_awaited_call_past_the_timeout_is_cancelled_and_the_env_closed():
    env = RemoteCounter(delay_s=5.0)
    with pytest.raises(EnvStepTimeout, match=r"env.step exceeded 0.05s \(awaited\)"):
        _play(EnvCaller(env, timeout_s=0.05), ["Up"])
    assert env.closed and env.finished_moves == 0 and env.in_flight == 0


def test_awaited_steps_are_not_capped_by_the_thread_pool():
    """64 envs wait at once on a 2-thread executor: every move is in flight before any ends."""
    count = 64

    async def play():
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(2))
        gate = threading.Event()
        envs = [RemoteCounter(gate=gate) for _ in range(count)]
        callers = [EnvCaller(env) for env in envs]
        for caller in callers:
            await caller("reset", seed=0)
        moves = [asyncio.ensure_future(caller("step", "<answer>Up</answer>")) for caller in callers]

        async def all_in_flight():
            while sum(env.in_flight for env in envs) < count:
                await asyncio.sleep(0.001)

        try:  # capped by the threads, it would never get there
            await asyncio.wait_for(all_in_flight(), 10)
        finally:
            gate.set()
        await asyncio.wait_for(asyncio.gather(*moves), 10)
        return envs

    envs = asyncio.run(play())
    assert all(env.finished_moves == 1 for env in envs)


def test_a_held_thread_lock_sends_an_async_env_to_the_sync_call_in_a_thread():
    env = RemoteCounter()
    caller = EnvCaller(env, use_thread_lock=True)

    async def contended():
        await caller("reset", seed=0)
        env_calls._ENV_LOCK.acquire()
        asyncio.get_running_loop().call_later(0.05, env_calls._ENV_LOCK.release)
        return await caller("step", "<answer>Up</answer>")

    asyncio.run(contended())
    assert env.threads[-1] != threading.get_ident() and not env_calls._ENV_LOCK.locked()


TOKENIZER = build_tiny_tokenizer()


async def _always_up(request):
    return GenerateOutput(
        request.request_id, [TOKENIZER.convert_tokens_to_ids("Up")], [-0.1], "length", policy_version=0
    )


def test_a_manager_plays_identical_episodes_awaited_and_in_threads():
    spec = EnvSpec(
        tag="T",
        env_type=f"{__name__}:RemoteCounter",
        env_config={},
        max_steps=5,
        max_tokens_per_step=1,
        response_prefix="<answer>",
    )

    def play(awaited: bool, seed: int):
        manager = TrajEnvManager(spec, TOKENIZER, _always_up, SamplingParams(), 4096)
        assert manager.env_calls.coroutines == {"reset", "step"}
        if not awaited:
            manager.env_calls.coroutines = frozenset()
        trajectory = asyncio.run(manager.run_episode(EpisodeSpec("g", "g-0", seed, 0)))
        return manager.env.threads, dataclasses.asdict(trajectory)

    for seed in (1, 2):
        (awaited_threads, awaited), (thread_threads, threaded) = play(True, seed), play(False, seed)
        assert awaited == threaded
        assert set(awaited_threads) == {threading.get_ident()} and threading.get_ident() not in thread_threads


def test_the_sync_bridge_refuses_a_running_loop_and_a_hook_must_be_async():
    env = RemoteCounter()
    env.reset(seed=0)

    async def inside():
        env.step("<answer>Up</answer>")

    with pytest.raises(RuntimeError, match=r"RemoteCounter.step runs the async _aapply .* await RemoteCounter.astep"):
        asyncio.run(inside())
    with pytest.raises(TypeError, match=r"NotAsync._aapply must be a coroutine function"):

        class NotAsync(RemoteCounter):
            def _aapply(self, action):
                return "x", 0.0, False, False


def test_an_async_hook_over_a_concrete_parent_runs_for_sync_calls_too():
    from envs.frozen_lake.env import FrozenLakeEnv

    class AsyncLake(FrozenLakeEnv):
        async def _aapply(self, action):
            await asyncio.sleep(0)
            return "remote", 1.0, True, False

    env = AsyncLake()
    env.reset(seed=0)
    assert env.step("<answer>Up</answer>")[:3] == ("remote", 1.0, True)
    assert async_calls(env) == {"step"}
