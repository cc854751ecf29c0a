"""How the agentic floor calls the engine: `GenerateFn`, the one signature of a generate call
(an `InferenceGateway`'s `generate`, a worker's, or a scripted model in tests), and
`generate_within`, that call bounded by a timeout. Env managers, agent loops and the proxy's
sessions all send their requests through it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from roll.core.records import GenerateOutput, GenerateRequest

GenerateFn = Callable[[GenerateRequest], Awaitable[GenerateOutput]]


class GenerateTimeout(RuntimeError):
    """The inference worker did not answer one generate request within the manager's timeout."""


async def generate_within(generate: GenerateFn, request: GenerateRequest, timeout_s: float | None) -> GenerateOutput:
    """`generate(request)`, or `GenerateTimeout` after `timeout_s` seconds (None: unbounded); what
    env managers and agent loops both send the engine. Awaited in the caller's task (not
    `wait_for`, which on 3.11 wraps it in a task of its own: one more trip through a busy event
    loop on the way in and one on the way out)."""
    try:
        async with asyncio.timeout(timeout_s):
            return await generate(request)
    except TimeoutError:
        raise GenerateTimeout(f"generate timeout: no answer within {timeout_s}s") from None
