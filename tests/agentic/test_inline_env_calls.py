"""Env calls an env declares cheap run inline in the event loop; the rest keep the thread path."""

import asyncio
import dataclasses
import threading
import time

import pytest

import envs  # noqa: F401  registers the built-ins
from roll.agentic.env import TextEnv, make_env
from roll.agentic.env_manager import env_calls
from roll.agentic.env_manager.env_calls import INLINE_STRIKES, EnvCaller, EnvStepTimeout
from roll.agentic.env_manager.traj_env_manager import TrajEnvManager
from roll.agentic.episode import EnvSpec, EpisodeSpec
from roll.core.records import GenerateOutput, SamplingParams
from roll.models.tiny import build_tiny_tokenizer


class ThreadRecordingEnv(TextEnv):
    """Records the thread each step runs in; sleeps `delay_s` per step (until closed)."""

    actions = ("Go",)
    cheap_calls = frozenset({"reset", "step"})

    def __init__(self, delay_s: float = 0.0):
        super().__init__()
        self.delay_s = delay_s
        self.threads: list[int] = []
        self.closed = threading.Event()

    def _reset(self, options):
        return "start"

    def _apply(self, action):
        self.threads.append(threading.get_ident())
        self.closed.wait(self.delay_s)
        return "moved", 0.0, False, False

    @property
    def success(self):
        return False

    def close(self):
        self.closed.set()


class SlowEnv(ThreadRecordingEnv):
    cheap_calls = frozenset()  # the default: every call in a thread


def _steps(caller: EnvCaller, count: int) -> list:
    async def play():
        await caller("reset", seed=0)
        return [await caller("step", "<answer>Go</answer>") for _ in range(count)]

    return asyncio.run(play())


def test_an_env_declaring_its_calls_cheap_is_stepped_in_the_event_loop():
    env = ThreadRecordingEnv()
    _steps(EnvCaller(env), 3)
    assert env.threads == [threading.get_ident()] * 3  # asyncio.run's loop runs in this thread


def test_an_env_declaring_nothing_is_stepped_in_threads():
    env = SlowEnv()
    _steps(EnvCaller(env), 2)
    assert threading.get_ident() not in env.threads and len(env.threads) == 2


class UserSubclass(ThreadRecordingEnv):
    """A user's subclass of a cheap env that may block in step: it declares nothing itself."""


def test_a_subclass_does_not_inherit_the_cheap_declaration():
    env = UserSubclass()
    _steps(EnvCaller(env), 2)
    assert threading.get_ident() not in env.threads and len(env.threads) == 2


def test_a_slow_env_still_times_out_on_the_thread_path_and_is_closed():
    env = SlowEnv(delay_s=0.5)
    started = time.monotonic()
    with pytest.raises(EnvStepTimeout, match=r"env.step exceeded 0.05s"):
        _steps(EnvCaller(env, timeout_s=0.05), 1)
    assert time.monotonic() - started < 0.45 and env.closed.is_set()


def test_an_inline_call_slower_than_the_timeout_fails_after_the_fact():
    env = ThreadRecordingEnv(delay_s=0.06)
    with pytest.raises(EnvStepTimeout, match="took .* inline"):
        _steps(EnvCaller(env, timeout_s=0.05), 1)
    assert env.closed.is_set()


def test_a_cheap_declaration_that_proves_wrong_moves_the_call_to_threads():
    env = ThreadRecordingEnv(delay_s=2 * env_calls.INLINE_BUDGET_S)
    caller = EnvCaller(env)
    _steps(caller, INLINE_STRIKES + 1)
    here = threading.get_ident()
    assert env.threads[:INLINE_STRIKES] == [here] * INLINE_STRIKES and env.threads[-1] != here
    assert caller.inline == {"reset"}


def test_one_slow_call_among_fast_ones_is_no_verdict(monkeypatch):
    monkeypatch.setattr(env_calls, "INLINE_BUDGET_S", 1.0)  # "fast" even on a busy machine
    caller = EnvCaller(ThreadRecordingEnv())
    caller.strikes["step"] = INLINE_STRIKES - 1
    _steps(caller, 1)  # fast: the strikes start again
    assert caller.strikes["step"] == 0 and "step" in caller.inline


def test_fault_injection_and_unknown_declarations():
    assert EnvCaller(make_env("frozen_lake", {})).inline == {"reset", "step"}
    assert EnvCaller(make_env("frozen_lake", {"fault_injection": {"hang_p": 0.5}})).inline == set()

    class Typo(ThreadRecordingEnv):
        cheap_calls = frozenset({"steps"})

    with pytest.raises(ValueError, match=r"Typo.cheap_calls names \['steps'\]"):
        EnvCaller(Typo())


def test_a_held_thread_lock_sends_the_call_to_a_thread_that_waits_for_it():
    env = ThreadRecordingEnv()
    caller = EnvCaller(env, use_thread_lock=True)
    _steps(caller, 1)
    assert env.threads == [threading.get_ident()]  # uncontended: inline, lock taken and released

    async def contended():
        env_calls._ENV_LOCK.acquire()
        asyncio.get_running_loop().call_later(0.05, env_calls._ENV_LOCK.release)
        return await caller("step", "<answer>Go</answer>")

    asyncio.run(contended())
    assert env.threads[-1] != threading.get_ident() and not env_calls._ENV_LOCK.locked()


TOKENIZER = build_tiny_tokenizer()
WORDS = ("Left", "Down", "Right", "Up")


async def _cycle_moves(request):
    turn = int(request.request_id.rsplit("/", 1)[1])
    return GenerateOutput(
        request.request_id, [TOKENIZER.convert_tokens_to_ids(WORDS[turn % 4])], [-0.1], "length", policy_version=0
    )


@pytest.mark.parametrize("env_type", ["frozen_lake", "sokoban"])
def test_inline_and_thread_paths_play_identical_episodes(env_type):
    spec = EnvSpec(
        tag="T", env_type=env_type, env_config={}, max_steps=6, max_tokens_per_step=1, response_prefix="<answer>"
    )

    def play(inline: bool, seed: int):
        manager = TrajEnvManager(spec, TOKENIZER, _cycle_moves, SamplingParams(), 4096)
        assert manager.env_calls.inline  # both built-ins declare something cheap
        if not inline:
            manager.env_calls.inline.clear()
        return dataclasses.asdict(asyncio.run(manager.run_episode(EpisodeSpec("g", "g-0", seed, 0))))

    for seed in (1, 2, 3):
        assert play(True, seed) == play(False, seed)
