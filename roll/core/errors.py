"""Errors that cross floors: raised by an inference engine, recognised by the rollout that called it."""

from __future__ import annotations


class EngineFailed(RuntimeError):
    """An inference engine raised while generating. The worker does not call a failed engine
    again (its state is unknown: vLLM, for one, keeps the failed requests and spins on them), so
    every pending and later request fails at once with this one-line message, and the run stops
    (the CLI prints it and exits 1). Its message names the engine and the engine's own error."""

    @classmethod
    def of(cls, engine_name: str, exc: BaseException) -> EngineFailed:
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
