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

from roll.agentic.rollout.records import GenerateOutput, GenerateRequest


class EngineManagedCache:
    """`kv_cache` of an engine that manages its prefix cache itself: holds nothing of ours."""

    num_tokens = 0

    def clear(self) -> None:
        """Nothing to clear here; the engine resets its own cache on a weight update."""

    def release(self, session_id: str) -> bool:
        return False


class EngineUnavailable(ImportError):
    """An inference engine cannot run here; the message is one line that says how to fix it."""


class EngineFailed(RuntimeError):
    """An inference engine raised while generating. The worker does not call a failed engine
    again (its state is unknown: vLLM, for one, keeps the failed requests and spins on them), so
    every pending and later request fails at once with this one-line message, and the run stops
    (the CLI prints it and exits 1). Its message names the engine and the engine's own error."""

    @classmethod
    def of(cls, engine_name: str, exc: BaseException) -> "EngineFailed":
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        detail = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
        return cls(f"inference engine {engine_name!r} failed: {detail}")


def engine_failure(exc: BaseException) -> EngineFailed | None:
    """The `EngineFailed` behind `exc`, itself or carried by a Ray task error (whose own text
    holds the remote traceback); None for any other error."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, EngineFailed):
        return EngineFailed(*cause.args)
    return EngineFailed(*exc.args) if isinstance(exc, EngineFailed) else None


def generate_live(requests: list[GenerateRequest], generate: Callable[[list[GenerateRequest]], list[GenerateOutput]],
                  policy_version: int) -> list[GenerateOutput]:
    """`generate(live)` for the requests that ask for tokens, in one call; requests with
    `max_new_tokens <= 0` answer an empty "length" output without reaching the engine (vLLM refuses
    max_tokens=0, and this is what `hf` answers). Outputs come back in request order."""
    live = [r for r in requests if r.params.max_new_tokens > 0]
    answered = iter(generate(live) if live else [])
    return [next(answered) if r.params.max_new_tokens > 0
            else GenerateOutput(r.request_id, [], [], "length", policy_version) for r in requests]
