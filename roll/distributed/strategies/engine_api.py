"""What the engines share: the stand-in for `kv_cache` of the external ones (`vllm`, `sglang`), the
one-line error when an engine's package is missing, the split of a batch into requests that need
the engine and requests that ask for no tokens, a request stopped at a token boundary
(`Suspended`, for partial rollout on `hf` and `vllm`), and the benchmarks' decode delay.

Why a stand-in: vLLM and SGLang cache prompt prefixes themselves (vLLM's prefix caching, SGLang's
radix cache), keyed by token ids rather than by session, and they evict on their own. The worker
still reports `kv_cached_tokens`; for these engines it is 0, since that memory is the engine's,
not ours (their own metrics tell its use).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from roll.core.records import GenerateOutput, GenerateRequest

DECODE_DELAY_VAR = "ROLL_DECODE_DELAY_MS"
"""Benchmarks only (set in the engine's environment, e.g. `actor_infer.system_envs`): every decode
step sleeps this many milliseconds on top of its compute, without holding a core, as if the engine
decoded on a device of its own (the latency-injected engine of benchmarks/rollout/partial_rollout.py)."""


def decode_delay_s() -> float:
    """`DECODE_DELAY_VAR`'s delay in seconds (0 when unset)."""
    return float(os.environ.get(DECODE_DELAY_VAR) or 0) / 1000


@dataclass
class Suspended:
    """A request stopped at a token boundary before it was done (partial rollout): the ids it
    sampled so far, the last of them not fed to the model yet, and their log-probs."""

    request: GenerateRequest
    token_ids: list[int]
    logprobs: list[float]


class EngineManagedCache:
    """`kv_cache` of an engine that manages its prefix cache itself: holds nothing of ours."""

    num_tokens = 0

    def clear(self) -> None:
        """Nothing to clear here; the engine resets its own cache on a weight update."""

    def release(self, session_id: str) -> bool:
        return False


class EngineUnavailable(ImportError):
    """An inference engine cannot run here; the message is one line that says how to fix it."""


def generate_live(
    requests: list[GenerateRequest],
    generate: Callable[[list[GenerateRequest]], list[GenerateOutput]],
    policy_version: int,
) -> list[GenerateOutput]:
    """`generate(live)` for the requests that ask for tokens, in one call; requests with
    `max_new_tokens <= 0` answer an empty "length" output without reaching the engine (vLLM refuses
    max_tokens=0, and this is what `hf` answers). Outputs come back in request order."""
    live = [r for r in requests if r.params.max_new_tokens > 0]
    answered = iter(generate(live) if live else [])
    return [
        next(answered)
        if r.params.max_new_tokens > 0
        else GenerateOutput(r.request_id, [], [], "length", policy_version)
        for r in requests
    ]
