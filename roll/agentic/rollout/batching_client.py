"""An env worker's client of one inference worker: generate requests and session releases made a
moment apart travel in one Ray call.

Contract:
- `generate(request)` resolves to that request's `GenerateOutput`, exactly as
  `inference.generate.remote(request)` would; a failed call fails each of its requests.
- A request waits at most `window_s` for company while no call of this client is in flight. While
  one is, new requests are held until it answers (then sent `window_s` later, together with the
  requests its answers wake), or at most `hold_s`. Managers whose episodes started a few
  milliseconds apart (groups arrive in separate `run_group` calls) would otherwise stay in
  separate cohorts for the whole episode, each paying an engine call a turn; held, they merge
  into one call a turn. The engine serves one call at a time anyway, so holding costs a request
  at most the rest of the call it would have queued behind; `hold_s` bounds it for long decodes.
- `release_session(id)` is best effort and not awaited: the ids released within `window_s` go in
  one `release_sessions` call (an episode ends per env, hundreds a step).
- `calls` and `requests` count the `generate_many` calls made and the requests they carried.
- `silent_s()`: how long the engine has answered none of this client's calls while one was in
  flight (0 when none is): the measure of a hung engine (`roll.core.errors.EngineHung`).
"""

from __future__ import annotations

import asyncio
import time


class BatchingClient:
    def __init__(self, inference, window_s: float = 0.002, hold_s: float = 0.02):
        self.inference = inference
        self.window_s = window_s
        self.hold_s = hold_s
        self._pending: list = []
        self._flush_handle: asyncio.TimerHandle | None = None
        self._in_flight = 0
        self._releases: list[str] = []
        self._release_handle: asyncio.TimerHandle | None = None
        self.calls = 0
        self.requests = 0
        self._sent: dict[int, float] = {}  # unanswered call number -> when its first request came
        self._last_answer = 0.0  # when a call last came back (answered or failed)

    def release_session(self, session_id: str) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (a synchronous caller): at once, alone
            self.inference.release_sessions.remote([session_id])
            return
        self._releases.append(session_id)
        if self._release_handle is None:
            self._release_handle = loop.call_later(self.window_s, self._flush_releases)

    def _flush_releases(self) -> None:
        ids, self._releases, self._release_handle = self._releases, [], None
        self.inference.release_sessions.remote(ids)

    async def generate(self, request):
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append((request, future, time.monotonic()))
        if self._flush_handle is None:
            delay = self.hold_s if self._in_flight else self.window_s
            self._flush_handle = loop.call_later(delay, self._flush)
        return await future

    def _flush(self) -> None:
        batch, self._pending, self._flush_handle = self._pending, [], None  # a handle exists only with requests
        self.calls += 1
        self.requests += len(batch)
        self._in_flight += 1
        self._sent[self.calls] = min(t for _, _, t in batch)  # its first request's wait began then
        ref = self.inference.generate_many.remote([r for r, _, _ in batch])
        asyncio.ensure_future(self._deliver(ref, [f for _, f, _ in batch], self.calls))

    def silent_s(self) -> float:
        """Seconds since the engine last answered while a request of this client waited: now minus
        the later of the last answer and the arrival of the oldest unanswered call's first request
        (a request's timeout counts from its arrival too); 0 with no call waiting."""
        if not self._sent:
            return 0.0
        return time.monotonic() - max(self._last_answer, min(self._sent.values()))

    async def _deliver(self, ref, futures, call: int) -> None:
        try:
            outputs = await ref
        except Exception as exc:  # every request of the call fails; their episodes are dropped
            for f in futures:
                if not f.done():
                    f.set_exception(exc)
        else:
            for f, out in zip(futures, outputs):
                if not f.done():
                    f.set_result(out)
        finally:
            self._in_flight -= 1
            del self._sent[call]
            self._last_answer = time.monotonic()
            if self._pending and not self._in_flight and self._flush_handle is not None:
                # the held requests go a window from now, with those that these answers wake
                self._flush_handle.cancel()
                self._flush_handle = asyncio.get_running_loop().call_later(self.window_s, self._flush)
