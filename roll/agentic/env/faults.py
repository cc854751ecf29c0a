"""Fault injection for any env: crashes, hangs and malformed step output, on purpose.

`env_config.fault_injection: {raise_p, hang_p, garbage_p, seed}` wraps whatever env a config names
(`make_env` does it), so the failure handling of the rollout (a dropped trajectory, counted and
logged with its cause; the env recreated; the step completed) can be exercised on real envs and
real runs. Each `step` draws one uniform number u from a generator seeded by (seed, the episode's
reset seed, and the episode key an env manager passes as the reset option `fault_episode_key`:
the episode's sampling seed). The faults an episode meets thus depend only on its seeds, never on
which env-worker slot played it or on timing, and the members of a group (one reset seed) fail
independently, as real envs do:
- u < raise_p: `step` raises `InjectedEnvError`;
- u < raise_p + hang_p: `step` blocks until the env is closed (a dropped env's manager closes it)
  or `hang_s` pass, then raises `InjectedEnvError`; an env manager's step timeout fires first;
- u < raise_p + hang_p + garbage_p: `step` returns a malformed tuple (observation None, reward NaN);
- otherwise the wrapped env steps normally.
"""

from __future__ import annotations

import threading
from typing import Any

import gymnasium as gym
import numpy as np
from pydantic import Field

from roll.configs.base import ConfigModel
from roll.core.seeding import derive_seed


class FaultInjection(ConfigModel):
    """Probabilities (per `step`) of each injected fault; their sum must be at most 1."""

    raise_p: float = Field(0.0, ge=0, le=1)
    hang_p: float = Field(0.0, ge=0, le=1)
    garbage_p: float = Field(0.0, ge=0, le=1)
    hang_s: float = Field(3600.0, gt=0)
    """Longest a hang lasts when nobody closes the env."""
    seed: int = 0

    def model_post_init(self, context: Any) -> None:
        if self.raise_p + self.hang_p + self.garbage_p > 1:
            raise ValueError("raise_p + hang_p + garbage_p must be <= 1")


EPISODE_KEY_OPTION = "fault_episode_key"  # a reset option the wrapper takes out before the env sees it


class InjectedEnvError(RuntimeError):
    """The failure a `FaultInjectingEnv` raises on purpose."""


class FaultInjectingEnv(gym.Wrapper):
    """`env` with the faults of `faults` injected into `step` (see the module docstring)."""

    def __init__(self, env: gym.Env, faults: FaultInjection) -> None:
        super().__init__(env)
        self.faults = faults
        self._rng = np.random.default_rng(derive_seed(faults.seed, "faults"))
        self._closed = threading.Event()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        options = dict(options or {})
        episode_key = options.pop(EPISODE_KEY_OPTION, None)
        key = (seed,) if episode_key is None else (seed, episode_key)
        self._rng = np.random.default_rng(derive_seed(self.faults.seed, "faults", *key))
        return self.env.reset(seed=seed, options=options or None)

    def step(self, action):
        f, u = self.faults, float(self._rng.random())
        if u < f.raise_p:
            raise InjectedEnvError("injected env crash")
        if u < f.raise_p + f.hang_p:
            released_by_close = self._closed.wait(f.hang_s)
            raise InjectedEnvError(f"injected env hang, ended by {'close' if released_by_close else 'hang_s'}")
        if u < f.raise_p + f.hang_p + f.garbage_p:
            return None, float("nan"), "yes", False, "not a dict"
        return self.env.step(action)

    def close(self) -> None:
        self._closed.set()  # releases a step hung in another thread
        super().close()

    def __getattr__(self, name: str) -> Any:
        """TextEnv attributes (`actions`, `scripted_action`, ...) of the wrapped env."""
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.env, name)
