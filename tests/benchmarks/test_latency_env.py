"""benchmarks/rollout/latency_env.py: the slow FrozenLake awaits its delay (`astep`) or, as
`ThreadedSlowFrozenLakeEnv`, sleeps it in a thread; both draw the same delays and play the same
moves as plain FrozenLake."""

import asyncio

from benchmarks.rollout.latency_env import SlowFrozenLakeEnv, ThreadedSlowFrozenLakeEnv
from envs.frozen_lake.env import FrozenLakeEnv
from roll.agentic.env_manager.env_calls import EnvCaller, async_calls

MOVES = ["<answer>Right</answer>", "<answer>Down</answer>", "no answer", "<answer>Left</answer>"]


def _play(env, awaited: bool) -> list:
    async def play():
        caller = EnvCaller(env)
        out = [await caller("reset", seed=3)]
        return out + [await caller("step", move) for move in MOVES]

    if awaited:
        return asyncio.run(play())
    return [env.reset(seed=3)] + [env.step(move) for move in MOVES]


def test_the_awaited_and_the_threaded_env_wait_alike_and_play_plain_frozen_lake():
    awaited, threaded = SlowFrozenLakeEnv(median_ms=1.0), ThreadedSlowFrozenLakeEnv(median_ms=1.0)
    assert async_calls(awaited) == {"step"} and async_calls(threaded) == frozenset()
    assert EnvCaller(awaited).inline == {"reset"} == EnvCaller(threaded).inline
    plain = _play(FrozenLakeEnv(), awaited=False)
    assert _play(awaited, awaited=True) == plain == _play(threaded, awaited=True)
    # the same delays: the instance number is in the seed, so compare each with a twin of its own
    twin = SlowFrozenLakeEnv(median_ms=1.0)
    twin._instance = awaited._instance
    _play(twin, awaited=False)
    assert twin.total_sleep_s == awaited.total_sleep_s > 0
