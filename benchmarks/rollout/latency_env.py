"""FrozenLake whose `step` takes a while, as a remote env or a tool call does (benchmarks only).

Each `step` sleeps for a log-normal time with median `median_ms` and shape `sigma` before playing
the move: median e^mu, mean median * e^(sigma^2 / 2), p99 median * e^(2.33 sigma). With the
defaults (50 ms, sigma 1) the mean is 82 ms and one step in a hundred takes over half a second: a
heavy tail, the case where a batch that waits for its slowest env loses most. `median_ms=0` gives
plain FrozenLake with the same code path (the zero-latency bound). The sleep releases the GIL,
like waiting on a socket, so envs stepped in threads overlap. Like a remote env written with
`asyncio`, it also serves `astep`: the env manager awaits the delay in its event loop, with no
thread (`roll.agentic.env_manager.env_calls`). `ThreadedSlowFrozenLakeEnv` is the same env
without `astep`, as a blocking client would be: its steps go to the worker's threads.

Latencies are drawn from the env's own generator, reseeded on every reset from (`latency_seed`,
the reset seed, the instance number in this process), never from `np_random`: the maps and moves
are those of plain FrozenLake with the same seeds, and the members of a group (same reset seed,
different instances) wait independent times. A run repeats its latencies when its groups land on
the same env instances.

    custom_envs.FrozenLake.env_type: benchmarks.rollout.latency_env:SlowFrozenLakeEnv
    custom_envs.FrozenLake.env_config: {median_ms: 50, sigma: 1.0, size: 4, ...}
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from typing import Any

import numpy as np

from envs.frozen_lake.env import FrozenLakeEnv
from roll.core.seeding import derive_seed

_INSTANCES = itertools.count()


class SlowFrozenLakeEnv(FrozenLakeEnv):
    """`FrozenLakeEnv` (any of its keyword arguments) with a log-normal delay in every step."""

    def __init__(self, median_ms: float = 50.0, sigma: float = 1.0, latency_seed: int = 0, **frozen_lake: Any):
        super().__init__(**frozen_lake)
        if median_ms < 0 or sigma < 0:
            raise ValueError(f"median_ms and sigma must be >= 0 (got {median_ms}, {sigma})")
        self.median_ms = float(median_ms)
        self.sigma = float(sigma)
        self.latency_seed = latency_seed
        self._instance = next(_INSTANCES)
        self._latency_rng = np.random.default_rng(derive_seed(latency_seed, "latency", self._instance))
        self.total_sleep_s = 0.0  # what this instance has slept, for a harness to check

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._latency_rng = np.random.default_rng(derive_seed(self.latency_seed, "latency", seed, self._instance))
        return super().reset(seed=seed, options=options)

    cheap_calls = frozenset({"reset"})  # reset draws no delay; step waits

    def step(self, action: str):
        delay = self.draw_latency_s()
        if delay > 0:
            time.sleep(delay)
            self.total_sleep_s += delay
        return super().step(action)

    async def astep(self, action: str):
        """`step` with the delay awaited (as a client on `asyncio` waits on its socket)."""
        delay = self.draw_latency_s()
        if delay > 0:
            await asyncio.sleep(delay)
            self.total_sleep_s += delay
        return super().step(action)

    def draw_latency_s(self) -> float:
        """The next step's delay in seconds (0 when `median_ms` is 0)."""
        if self.median_ms == 0:
            return 0.0
        return self.median_ms / 1000.0 * math.exp(self.sigma * float(self._latency_rng.standard_normal()))


class ThreadedSlowFrozenLakeEnv(SlowFrozenLakeEnv):
    """`SlowFrozenLakeEnv` with its `step` only (no `astep`): the env manager steps it in a thread."""

    cheap_calls = frozenset({"reset"})
    astep = None  # type: ignore[assignment]
