"""How an env manager calls its env: inline when the env says the call is cheap, else in a thread.

Many managers share one event loop in an env worker, so a call that blocks would stall them all;
by default each `env.reset` / `env.step` therefore runs in a thread of the loop's executor,
bounded by the step timeout (a call that times out leaves its thread behind: the env is closed
at once, which releases a well-behaved env). That hand-off costs 150-350 us per call, several
times a FrozenLake step. An env class that names a call in `TextEnv.cheap_calls` gets that call
run directly in the event loop instead: no thread, no hand-off.

What the inline path keeps and loses:
- The step timeout still applies, after the fact: an inline call that returns later than the
  timeout closes the env and raises `EnvStepTimeout`, as on the thread path. What it cannot do
  is stop a call that never returns; that is why only the env class can opt in.
- A declaration that turns out wrong is corrected by measurement: after `INLINE_STRIKES` inline
  calls in a row slower than `INLINE_BUDGET_S`, that call goes to threads for the rest of the
  env's life (in a row: one slow call on a busy machine is no verdict on the env).
- `use_thread_lock` and `max_env_step_concurrent` are still honoured: the inline path takes the
  lock / semaphore without waiting, and a call that would have to wait goes to a thread.

An env whose class serves a call as a coroutine (`astep` / `areset`, e.g. a `TextEnv` that writes
`_aapply`) has it awaited in the loop instead, under the timeout, which cancels it; that path
takes precedence over both others. It is used only where the coroutine's class is the one that
defines the sync call or a subclass of it: a subclass that overrides `step` alone keeps its `step`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import Callable
from time import perf_counter
from typing import TYPE_CHECKING

INLINE_BUDGET_S = 0.005  # an inline call slower than this blocked every other manager too long
INLINE_STRIKES = 3  # over-budget inline calls before that call moves to threads for good
INLINE_CALLS = frozenset({"reset", "step"})  # what `TextEnv.cheap_calls` may name
ASYNC_TWINS = {"reset": "areset", "step": "astep"}  # the coroutine an env may serve each call as

# `use_thread_lock`: one lock per env-worker process; `max_env_step_concurrent`: one semaphore per
# tag and process. Shared by both paths, so they hold across threads and the event loop.
_ENV_LOCK = threading.Lock()
_STEP_LIMITS: dict[tuple[str, int], threading.BoundedSemaphore] = {}
if TYPE_CHECKING:  # threading.Lock is a factory function at run time
    _Guard = threading.Lock | threading.BoundedSemaphore


class EnvStepTimeout(RuntimeError):
    """env.reset or env.step took longer than the manager's step timeout."""


def declared_cheap_calls(env) -> frozenset[str]:
    """The calls `env`'s own class declares cheap (`cheap_calls`), checked: an unknown name is an
    error. A declaration is not inherited: a subclass (a user's FrozenLake that adds a database
    lookup to `step`) runs on threads unless it declares `cheap_calls` itself, so that a blocking
    override can never stall the event loop; nor is it taken from a wrapped env (FaultInjectingEnv,
    whose injected hangs block, declares nothing)."""
    declared = frozenset(type(env).__dict__.get("cheap_calls", frozenset()))
    unknown = sorted(declared - INLINE_CALLS)
    if unknown:
        raise ValueError(f"{type(env).__name__}.cheap_calls names {unknown}; it may name only {sorted(INLINE_CALLS)}")
    return declared


def async_calls(env) -> frozenset[str]:
    """The calls ("reset", "step") `env`'s class serves as coroutines (`areset` / `astep`), each
    counted only where the coroutine's class is the sync call's class or a subclass of it."""
    cls = type(env)
    found = set()
    for name, twin in ASYNC_TWINS.items():
        if inspect.iscoroutinefunction(getattr(cls, twin, None)) and issubclass(_owner(cls, twin), _owner(cls, name)):
            found.add(name)
    return frozenset(found)


def _owner(cls: type, name: str) -> type:
    """The class in `cls`'s MRO that defines `name` (object when none does)."""
    return next((klass for klass in cls.__mro__ if name in klass.__dict__), object)


class EnvCaller:
    """Calls one env's `reset` / `step` on the cheapest safe path (see the module docstring)."""

    def __init__(
        self,
        env,
        *,
        tag: str = "",
        timeout_s: float | None = 60.0,
        use_thread_lock: bool = False,
        max_env_step_concurrent: int = 0,
    ):
        self.env = env
        self.timeout_s = timeout_s
        self.inline = set(declared_cheap_calls(env))  # shrinks when a call proves slow
        self.coroutines = async_calls(env)
        self.strikes = dict.fromkeys(INLINE_CALLS, 0)
        step_limit = None
        if max_env_step_concurrent > 0:
            key = (tag, max_env_step_concurrent)
            step_limit = _STEP_LIMITS.setdefault(key, threading.BoundedSemaphore(max_env_step_concurrent))
        lock: list[_Guard] = [_ENV_LOCK] if use_thread_lock else []
        steps: list[_Guard] = [step_limit] if step_limit else []
        self._guards = {"step": steps + lock, "reset": lock}

    async def __call__(self, name: str, *args, **kwargs):
        guards = self._guards.get(name, [])
        if name in self.coroutines:
            with _taken_now(guards) as taken:
                if taken:  # else a guard is held: the sync call waits for it in a thread
                    return await self._await(name, *args, **kwargs)
        elif name in self.inline:
            if not guards:  # the common case, kept short: this runs on every step
                return self._call_inline(name, *args, **kwargs)
            with _taken_now(guards) as taken:
                if taken:
                    return self._call_inline(name, *args, **kwargs)
        return await self._call_in_thread(name, guards, *args, **kwargs)

    def _call_inline(self, name: str, *args, **kwargs):
        start = perf_counter()
        result = getattr(self.env, name)(*args, **kwargs)
        elapsed = perf_counter() - start
        # consecutive strikes only: a lone slow call is the machine (a busy core, a GC pause)
        self.strikes[name] = self.strikes[name] + 1 if elapsed > INLINE_BUDGET_S else 0
        if self.strikes[name] >= INLINE_STRIKES:
            self.inline.discard(name)
        if self.timeout_s is not None and elapsed > self.timeout_s:
            self.close()
            raise EnvStepTimeout(f"env.{name} exceeded {self.timeout_s}s (took {elapsed:.3g}s inline)")
        return result

    async def _await(self, name: str, *args, **kwargs):
        try:
            return await asyncio.wait_for(getattr(self.env, ASYNC_TWINS[name])(*args, **kwargs), self.timeout_s)
        except TimeoutError:
            self.close()
            raise EnvStepTimeout(f"env.{name} exceeded {self.timeout_s}s (awaited)") from None

    async def _call_in_thread(self, name: str, guards: list[_Guard], *args, **kwargs):
        call: Callable = getattr(self.env, name)
        if guards:
            unguarded = call

            def call(*a, **kw):
                with contextlib.ExitStack() as stack:
                    for guard in guards:
                        stack.enter_context(guard)
                    return unguarded(*a, **kw)

        try:
            return await asyncio.wait_for(asyncio.to_thread(call, *args, **kwargs), self.timeout_s)
        except TimeoutError:
            self.close()
            raise EnvStepTimeout(f"env.{name} exceeded {self.timeout_s}s") from None

    def close(self) -> None:
        """Close the env (a dropped env may hold a hung thread, a server session...); best effort."""
        try:
            self.env.close()
        except Exception:  # the env is being discarded anyway
            pass


@contextlib.contextmanager
def _taken_now(guards: list[_Guard]):
    """Yields whether every guard was taken without waiting; releases what was taken on exit."""
    held = _try_acquire(guards)
    try:
        yield held is not None
    finally:
        for guard in reversed(held or []):
            guard.release()


def _try_acquire(guards: list[_Guard]) -> list[_Guard] | None:
    """Every guard taken without waiting (in order), or None with none held."""
    held: list[_Guard] = []
    for guard in guards:
        if not guard.acquire(blocking=False):
            for taken in reversed(held):
                taken.release()
            return None
        held.append(guard)
    return held
