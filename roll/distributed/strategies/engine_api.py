"""What the external engines (`vllm`, `sglang`) share: the stand-in for `kv_cache`, the one-line
error when an engine's package is missing, and the split of a batch into requests that need the
engine and requests that ask for no tokens.

Why a stand-in: vLLM and SGLang cache prompt prefixes themselves (vLLM's prefix caching, SGLang's
radix cache), keyed by token ids rather than by session, and they evict on their own. The worker
still reports `kv_cached_tokens`; for these engines it is 0, since that memory is the engine's,
not ours (their own metrics tell its use).
"""

from __future__ import annotations

from collections.abc import Callable

from roll.core.records import GenerateOutput, GenerateRequest


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
