"""A one-line console view of training: steps done, and the numbers worth watching live.

The postfix shows the latest train reward and success, the latest validation success (kept until
the next validation, since it is measured only every `eval_steps`) and the step time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tqdm import tqdm

from roll.tracking.tracker import to_float

# metrics key -> short postfix label, in display order
POSTFIX_KEYS = {
    "train/episode_reward": "reward",
    "train/success": "success",
    "val/success": "val_success",
    "time/step_s": "step_s",
}


class ProgressBar:
    """tqdm over training steps; `initial` is the step a resumed run starts after."""

    def __init__(self, total_steps: int, initial: int = 0) -> None:
        self.postfix: dict[str, str] = {}
        self._bar = tqdm(total=total_steps, initial=initial, unit="step", dynamic_ncols=True)

    def update(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Move to `step` (steps done so far) and show whichever postfix keys `metrics` has."""
        for key, label in POSTFIX_KEYS.items():
            if metrics.get(key) is not None:
                self.postfix[label] = f"{to_float(metrics[key]):.3g}"
        self._bar.set_postfix(
            {label: self.postfix[label] for label in POSTFIX_KEYS.values() if label in self.postfix},
            refresh=False,
        )
        self._bar.update(step - self._bar.n)

    def close(self) -> None:
        self._bar.close()
