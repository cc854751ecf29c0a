"""Where a worker's time goes: the seconds it spends computing and syncing, for the driver's
per-step idle accounting (`roll.pipeline.phases.idle_time`).

A worker inherits `Clocked` and marks its methods with `@timed("compute")` (training, scoring,
generating) or `@timed("sync")` (weights out or in, moves between device and host). The totals
are cumulative; `work_seconds()` reads them with any call still running counted up to now, so
the driver's two readings around a step give exactly the seconds spent inside it.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

KINDS = ("compute", "sync")

F = TypeVar("F", bound=Callable[..., Any])


class WorkClock:
    """Cumulative seconds per kind, with the intervals still open; safe across threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = dict.fromkeys(KINDS, 0.0)
        self._open: dict[int, tuple[str, float]] = {}
        self._ids = iter(range(1 << 62))

    @contextmanager
    def measure(self, kind: str) -> Iterator[None]:
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}; one of {KINDS}")
        with self._lock:
            token = next(self._ids)
            self._open[token] = (kind, time.perf_counter())
        try:
            yield
        finally:
            with self._lock:
                _, start = self._open.pop(token)
                self._done[kind] += time.perf_counter() - start

    def read(self) -> dict[str, float]:
        """Seconds per kind so far, open intervals up to now."""
        with self._lock:
            now, totals = time.perf_counter(), dict(self._done)
            for kind, start in self._open.values():
                totals[kind] += now - start
        return totals


class Clocked:
    """Mixin of the workers whose time the driver accounts (`work_seconds`)."""

    _work_clock: WorkClock | None = None

    @property
    def clock(self) -> WorkClock:
        if self._work_clock is None:
            self._work_clock = WorkClock()
        return self._work_clock

    def work_seconds(self) -> dict[str, float]:
        """{"compute": s, "sync": s} since this process started (`WorkClock.read`)."""
        return self.clock.read()


def timed(kind: str) -> Callable[[F], F]:
    """Count the method's wall time as `kind` on its worker's clock."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(self, *args, **kwargs):
            with self.clock.measure(kind):
                return fn(self, *args, **kwargs)

        return inner  # type: ignore[return-value]

    return wrap
