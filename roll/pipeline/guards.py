"""Stop a run that cannot learn any more, with one clear line instead of silently training on.

The training strategy skips an optimizer step whose loss or gradient is not finite (the weights
stay as they were) and counts the streak of such skips (`<role>/consecutive_skipped_steps`). One
skip is noise; a streak means the run has diverged (a too-high learning rate, a broken reward)
and every further step would be skipped too.
"""

from __future__ import annotations

from roll.core.errors import RunStopped

STREAK_KEYS = ("actor/consecutive_skipped_steps", "critic/consecutive_skipped_steps")


class TrainingDiverged(RunStopped, RuntimeError):
    """Raised by `stop_if_diverged`; the CLI prints it as one line and exits 1."""


def stop_if_diverged(metrics: dict[str, float], limit: int, step: int) -> None:
    """Raise `TrainingDiverged` when a role's streak of skipped updates reached `limit` (0: never)."""
    if limit <= 0:
        return
    for key in STREAK_KEYS:
        streak = int(metrics.get(key, 0))
        if streak >= limit:
            role = key.split("/")[0]
            raise TrainingDiverged(
                f"step {step}: the last {streak} {role} updates had a non-finite loss or gradient and were "
                f"skipped (max_consecutive_skipped_steps={limit}); the run stops. Resume from the last "
                "checkpoint with a lower learning_rate or check the rewards."
            )
