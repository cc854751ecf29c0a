"""The rollout scheduler's watch for stuck env workers: a deadline per running group.

A group that has run `hung_timeout_s` (ROLL's `env_monitor.hung_timeout`) has its env worker
probed once with `ping`, an async method served on the worker's event loop (Ray's own readiness
call answers even when that loop is blocked). A worker that answers is slow: logged, left running.
One silent for `probe_s` (at most half the bound, so a stuck worker is named within 1.5x the
bound) is stuck: killed for Ray to restart, and `restarted[worker]` says why, for the causes of
the groups it loses. `hung_timeout_s=None` watches nothing.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol

import ray

logger = logging.getLogger(__name__)


class Running(Protocol):
    """What the watch reads of a running group: where it runs, what it is, since when (read only:
    the scheduler's record is frozen)."""

    @property
    def worker(self) -> int: ...
    @property
    def tag(self) -> str: ...
    @property
    def group_id(self) -> str: ...
    @property
    def started(self) -> float: ...


class HangWatch:
    def __init__(self, workers: list, hung_timeout_s: float | None, probe_s: float = 10.0):
        self.workers = workers
        self.hung_timeout_s = hung_timeout_s
        self.probe_s = probe_s if hung_timeout_s is None else min(probe_s, hung_timeout_s / 2)
        self._probe_is_half = hung_timeout_s is not None and hung_timeout_s / 2 <= probe_s
        self._probed: set = set()  # running refs whose worker was probed (answered: slow, not stuck)
        self.restarted: dict[int, str] = {}  # env worker killed as stuck -> why

    def ended(self, ref) -> None:
        """The group of `ref` is no longer running."""
        self._probed.discard(ref)

    def wait_s(self, running: Mapping[Any, Running], timeout_s: float) -> float:
        """How long the scheduler's next wait may block: until the first unprobed group passes
        the bound, at most `timeout_s`."""
        if self.hung_timeout_s is None:
            return timeout_s
        starts = [run.started for ref, run in running.items() if ref not in self._probed]
        due = min(starts, default=float("inf")) + self.hung_timeout_s - time.monotonic()
        return max(0.0, min(timeout_s, due))

    def check(self, running: Mapping[Any, Running]) -> bool:
        """Probe the workers of the groups past the bound (each group once); kill the silent ones.
        True when a group was over the bound."""
        if self.hung_timeout_s is None:
            return False
        now = time.monotonic()
        late = [
            ref for ref, run in running.items() if ref not in self._probed and now - run.started >= self.hung_timeout_s
        ]
        by_worker: dict[int, list] = collections.defaultdict(list)
        for ref in late:
            self._probed.add(ref)
            by_worker[running[ref].worker].append(running[ref])
        for worker, runs in by_worker.items():
            self._probe(worker, runs[0], now)
        return bool(late)

    def _probe(self, worker: int, run: Running, now: float) -> None:
        where = f"group {run.group_id} ({run.tag}) on env worker {worker} has run {now - run.started:.0f} s"
        answered, _ = ray.wait([self.workers[worker].ping.remote()], timeout=self.probe_s)
        if answered:
            logger.warning(
                "%s (env_monitor.hung_timeout %g s); the worker answers: slow, not stuck", where, self.hung_timeout_s
            )
            return
        half = " (half the bound)" if self._probe_is_half else ""
        self.restarted[worker] = (
            f"{where} and answered no probe within {self.probe_s:g} s{half}: stuck, killed for Ray to restart"
        )
        logger.warning("hang: %s", self.restarted[worker])
        ray.kill(self.workers[worker], no_restart=False)

    def cause_of_death(self, worker: int, err: BaseException) -> str:
        """The cause given to each trajectory a dead env worker's group loses."""
        if worker in self.restarted:  # killed here as stuck
            return f"env worker {worker} restarted: {self.restarted[worker]}"
        return f"env worker {worker} died: {type(err).__name__}"

    def recovered(self, worker: int) -> None:
        """`worker` answers again after a restart: its later deaths are its own."""
        self.restarted.pop(worker, None)
