"""The project's errors: each kind carries the exit status and the message prefix the CLI reports.

`RollError` is the base: an error the user can act on, reported by `roll.cli.main` as one line,
`"{prefix}: {message}"` on stderr, and the exit status `exit_code` (no traceback). Anything else
that goes wrong is a bug and keeps its traceback. The kinds:

- `BadConfig` (exit 2, "config error"): the run cannot start as configured. `roll.configs.ConfigError`,
  `roll.distributed.placement.PlacementError`, `roll.pipeline.phases.checkpoint.CheckpointDamaged`.
- `RunStopped` (exit 1, "training stopped"): a run that cannot go on for a known reason (diverged
  training, a rollout that keeps failing, a failed or hung engine, a hung worker, a full disk, a
  dead worker or node).
- others set their own: `roll.pipeline.setup.cluster.ClusterError` (exit 2, "cluster error"),
  `roll.pipeline.checks.resources.NothingToTrain` (exit 0, no prefix), `roll.cli.Terminated`
  (exit 128 + the signal).

Concrete errors keep their historical builtin base too (`RuntimeError`, `ValueError`), so code that
catches those still does.
"""

from __future__ import annotations


class RollError(Exception):
    """An error the CLI reports as one line and an exit status, without a traceback."""

    exit_code: int = 1
    """The process exit status `roll.cli.main` returns for it."""
    prefix: str = "error"
    """What the one line starts with ("config error", "training stopped"); empty: the message alone."""

    def line(self) -> str:
        """The one line the CLI prints: `"{prefix}: {message}"`."""
        return f"{self.prefix}: {self}" if self.prefix else str(self)


class BadConfig(RollError):
    """The run cannot start as configured; the message names the key at fault."""

    exit_code = 2
    prefix = "config error"


class RunStopped(RollError):
    """The run cannot go on for a known reason; resume from the last checkpoint once it is fixed."""

    exit_code = 1
    prefix = "training stopped"


class EngineFailed(RunStopped, RuntimeError):
    """An inference engine raised while generating. The worker does not call a failed engine
    again (its state is unknown: vLLM, for one, keeps the failed requests and spins on them), so
    every pending and later request fails at once with this one-line message, and the run stops
    (the CLI prints it and exits 1). Its message names the engine and the engine's own error."""

    @classmethod
    def of(cls, engine_name: str, exc: BaseException) -> EngineFailed:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        detail = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
        return cls(f"inference engine {engine_name!r} failed: {detail}")


class EngineHung(EngineFailed):
    """An inference engine answered none of an env worker's generate calls for a whole
    `generate_timeout_s` while some waited: alive but stuck (a deadlock, a wedged device). The run
    stops as for a failed engine; the message names the engine and the seconds it was silent."""


def engine_failure(exc: BaseException) -> EngineFailed | None:
    """The `EngineFailed` behind `exc`, itself or carried by a Ray task error (whose own text
    holds the remote traceback); None for any other error."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, EngineFailed):
        return EngineFailed(*cause.args)
    return EngineFailed(*exc.args) if isinstance(exc, EngineFailed) else None
