"""Run outputs: metrics.jsonl + TensorBoard (`Tracker`), the console bar (`ProgressBar`) and
`python -m roll.tracking.plot RUN_DIR` for curves."""

from roll.tracking.progress import ProgressBar
from roll.tracking.tracker import METRICS_FILE, Tracker

__all__ = ["METRICS_FILE", "ProgressBar", "Tracker"]
