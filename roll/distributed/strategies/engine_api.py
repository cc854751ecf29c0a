"""What the external engines (`vllm`, `sglang`) share: the stand-in for `kv_cache` and the one-line
error when an engine's package is missing.

Why a stand-in: vLLM and SGLang cache prompt prefixes themselves (vLLM's prefix caching, SGLang's
radix cache), keyed by token ids rather than by session, and they evict on their own. The worker
still reports `kv_cached_tokens`; for these engines it is 0, since that memory is the engine's,
not ours (their own metrics tell its use).
"""

from __future__ import annotations


class EngineManagedCache:
    """`kv_cache` of an engine that manages its prefix cache itself: holds nothing of ours."""

    num_tokens = 0

    def clear(self) -> None:
        """Nothing to clear here; the engine resets its own cache on a weight update."""

    def release(self, session_id: str) -> bool:
        return False


class EngineUnavailable(ImportError):
    """An inference engine cannot run here; the message is one line that says how to fix it."""
