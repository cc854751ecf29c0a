"""One `generate` in front of several inference workers: least-loaded routing, sticky sessions.

Agents (and env managers) see a single client with `async generate(request)`; the gateway picks
the worker. A new conversation goes to the worker with the fewest requests in flight (ties: the
lowest index), so a burst of episodes spreads evenly and a slow worker gets fewer. Every later
turn of that conversation goes to the same worker, which keeps the conversation's KV and only
prefills what the turn adds (`GenerateRequest.session_id`); sending turn 2 elsewhere would
recompute the whole prefix. The conversation is the request's `session_id`, or, when it has
none, its request id up to the last "/" (env managers and agents name turns `traj_id/turn`).

A sticky entry lives until `release(session_id)` (the episode ended; the worker is told to drop
the KV too) or until it is the least recently used of `max_sessions` entries, which bounds the
gateway's memory when callers forget to release. Routing an evicted session anew is only slower,
never wrong: a worker serves any prompt exactly, cached or not.

Workers are Ray actor handles (`worker.generate.remote(request)`) or local objects whose
`generate` is a coroutine method; both may be mixed.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from roll.core.records import GenerateOutput, GenerateRequest


def is_ray_actor(worker: Any) -> bool:
    """Whether `worker` is a Ray actor handle; without importing ray (slow) when nothing has."""
    actor = sys.modules.get("ray.actor")
    return actor is not None and isinstance(worker, actor.ActorHandle)


def session_key(request: GenerateRequest) -> str | None:
    """The conversation a request belongs to; None for a one-off request (no session, no "/")."""
    if request.session_id is not None:
        return request.session_id
    prefix, sep, _ = request.request_id.rpartition("/")
    return prefix if sep else None


class InferenceGateway:
    """Routes generate requests over `workers`; see the module docstring."""

    def __init__(self, workers: Sequence[Any], max_sessions: int = 65536):
        if not workers:
            raise ValueError("InferenceGateway needs at least one inference worker")
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        self.workers = list(workers)
        self._remote = [is_ray_actor(w) for w in self.workers]
        self.max_sessions = max_sessions
        self._sticky: OrderedDict[str, int] = OrderedDict()  # session -> worker index, LRU order
        self.in_flight = [0] * len(self.workers)
        self.requests = [0] * len(self.workers)
        self.sticky_hits = 0
        self.evictions = 0
        self._background: set[asyncio.Future] = set()

    def route(self, request: GenerateRequest) -> int:
        """The worker index for `request`, recording a new conversation's choice."""
        key = session_key(request)
        if key is not None and key in self._sticky:
            self._sticky.move_to_end(key)
            self.sticky_hits += 1
            return self._sticky[key]
        index = min(range(len(self.workers)), key=lambda i: (self.in_flight[i], i))
        if key is not None:
            self._sticky[key] = index
            if len(self._sticky) > self.max_sessions:
                self._sticky.popitem(last=False)
                self.evictions += 1
        return index

    async def generate(self, request: GenerateRequest) -> GenerateOutput:
        index = self.route(request)
        self.in_flight[index] += 1
        self.requests[index] += 1
        try:
            worker = self.workers[index]
            if self._remote[index]:
                return await worker.generate.remote(request)
            return await worker.generate(request)
        finally:
            self.in_flight[index] -= 1

    def release(self, session_id: str) -> bool:
        """Forget `session_id`'s worker and tell that worker to drop its KV (best effort, not
        awaited). True if the session was sticky."""
        index = self._sticky.pop(session_id, None)
        if index is None:
            return False
        worker = self.workers[index]
        if self._remote[index]:
            worker.release_session.remote(session_id)
        elif callable(getattr(worker, "release_session", None)):
            result = worker.release_session(session_id)
            if inspect.isawaitable(result):  # an async method: run it in the background
                task = asyncio.ensure_future(result)
                self._background.add(task)  # held, so it is not garbage-collected mid-way
                task.add_done_callback(self._background.discard)
        return True

    def worker_of(self, session_id: str) -> int | None:
        """The worker a session is pinned to, if any (does not refresh its LRU position)."""
        return self._sticky.get(session_id)

    def get_stats(self) -> dict[str, Any]:
        return {
            "requests_per_worker": list(self.requests),
            "in_flight_per_worker": list(self.in_flight),
            "in_flight": sum(self.in_flight),
            "sticky_hits": self.sticky_hits,
            "sticky_sessions": len(self._sticky),
            "sticky_evictions": self.evictions,
        }
