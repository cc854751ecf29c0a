"""Divergence, caught: stop a run that cannot learn any more, and warn of one whose trainer and
engine disagree on the numbers it learns from, with one clear line instead of silently training on.

- `stop_if_diverged`: the training strategy skips an optimizer step whose loss or gradient is not
  finite (the weights stay as they were) and counts the streak of such skips
  (`<role>/consecutive_skipped_steps`). One skip is noise; a streak means the run has diverged (a
  too-high learning rate, a broken reward) and every further step would be skipped too.
- `engine_gap_warning`: on a run's first step the engine and the trainer hold the same weights,
  so the trainer's log-probs of the sampled tokens must be the engine's up to precision
  (`rollout/logprob_abs_diff`). A larger gap means the trainer scores other inputs than the
  engine sampled from (images left behind, other positions, another template): every PPO ratio is
  then noise.
"""

from __future__ import annotations

from roll.core.errors import RunStopped

STREAK_KEYS = ("actor/consecutive_skipped_steps", "critic/consecutive_skipped_steps")
ENGINE_GAP_WARN = 0.1
"""Mean |engine - trainer| log-prob of a sampled token (nats) over which the first step warns; a
bf16 engine's rounding alone stays well under it."""


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


def engine_gap_warning(metrics: dict[str, float], step: int) -> str | None:
    """The warning for a first step (`step`) whose `rollout/logprob_abs_diff` is over
    `ENGINE_GAP_WARN` while every trajectory came from the current weights
    (`rollout/staleness_max` 0); None otherwise."""
    gap = metrics.get("rollout/logprob_abs_diff", 0.0)
    if metrics.get("rollout/staleness_max", 0.0) > 0 or gap <= ENGINE_GAP_WARN:
        return None
    return (
        f"step {step}: the trainer's log-probs of the engine's sampled tokens differ from the engine's by "
        f"{gap:.3g} nats a token on the same weights (rollout/logprob_abs_diff; over {ENGINE_GAP_WARN}): "
        "the trainer does not score what the engine sampled from (its inputs, positions or template "
        "differ, or the engine reports log-probs of a truncated or rescaled distribution), so the PPO "
        "ratios are noise"
    )
