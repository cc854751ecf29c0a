"""Per-step schedules of loss weights: a coefficient as a pure function of the training step.

`scheduled(value, schedule, step, max_steps)` is the weight for pipeline step `step` (1-based):
- "constant": `value` at every step;
- "linear": from `value` at step 1 down toward 0, `value * (1 - (step - 1) / max_steps)`;
- "cosine": `value * (1 + cos(pi * (step - 1) / max_steps)) / 2`, the factor of the cosine
  learning-rate schedule (without warm-up) at the same step, so both decay together.
A pure function of the step, so a resumed run continues the schedule where it stopped.
"""

from __future__ import annotations

import math
from typing import Literal

Schedule = Literal["constant", "linear", "cosine"]


def scheduled(value: float, schedule: Schedule, step: int, max_steps: int) -> float:
    if schedule == "constant":
        return value
    progress = min(max(step - 1, 0) / max(max_steps, 1), 1.0)
    if schedule == "linear":
        return value * (1.0 - progress)
    if schedule == "cosine":
        return value * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown schedule {schedule!r}: one of constant, linear, cosine")
