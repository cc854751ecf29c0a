"""Polling with a time limit: `wait_until` asks a probe again every `interval_s` seconds until it
answers or `timeout_s` has passed on the monotonic clock (what a wall-clock jump cannot shorten)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(probe: Callable[[], T | None], timeout_s: float, interval_s: float) -> T | None:
    """`probe()`'s first answer other than None, or None when the deadline `timeout_s` from now has
    passed. The probe runs at once and then after every `interval_s` of sleep; the last one runs at
    or after the deadline, so a timeout of 0 asks exactly once and never sleeps."""
    deadline = time.monotonic() + timeout_s
    while True:
        answer = probe()
        if answer is not None or time.monotonic() >= deadline:
            return answer
        time.sleep(interval_s)
