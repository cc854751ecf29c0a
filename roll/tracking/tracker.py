"""Metrics of a run, written twice: `output_dir/metrics.jsonl` and TensorBoard under `logging_dir`.

metrics.jsonl is the contract (DESIGN.md "Outputs of a run"): one JSON object per `log` call,
`{"step": N, "<key>": float, ...}`, flushed line by line so a killed run keeps what it logged.
TensorBoard gets the same keys as scalars at the same step.

A resumed run restarts from its last checkpoint, but the killed run may have logged a few steps
past it; those lines are dropped and TensorBoard purges its events after the checkpoint, so each
step appears once in both.
"""

from __future__ import annotations

import errno
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Self

import numpy as np
from torch.utils.tensorboard import SummaryWriter

from roll.utils.atomic import write_atomic

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"


def to_float(value: Any) -> float:
    """A Python float from a number, a bool, a NumPy scalar or a one-element tensor/array."""
    if hasattr(value, "item"):
        value = value.item()
    return float(value)


def truncate_metrics(path: Path, last_step: int) -> int:
    """Keep the lines of `path` with step <= `last_step`; return how many lines were dropped (the
    steps after the checkpoint, which the resumed run logs again). A line that does not parse
    (cut short by a kill, or damaged) is never deleted: it is appended to `<path>.corrupt` and
    reported in one warning. The file is rewritten atomically."""
    kept, dropped, damaged = [], 0, []
    for line in path.read_text(errors="replace").splitlines():
        try:
            keep = int(json.loads(line)["step"]) <= last_step
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            damaged.append(line + "\n")
            continue
        if keep:
            kept.append(line + "\n")
        else:
            dropped += 1
    if damaged:
        corrupt = path.with_name(path.name + ".corrupt")
        with open(corrupt, "a") as f:
            f.writelines(damaged)
            f.flush()
            os.fsync(f.fileno())
        log.warning("%s: %d damaged line(s) moved to %s", path, len(damaged), corrupt)
    write_atomic(path, "".join(kept))
    return dropped


class Tracker:
    """Append-only metrics log of one run; `resume_step` is the step of the checkpoint resumed
    from (None for a fresh run, which starts a new metrics.jsonl)."""

    def __init__(
        self,
        output_dir: str | os.PathLike[str],
        logging_dir: str | os.PathLike[str],
        *,
        resume_step: int | None = None,
        backend=None,
    ) -> None:
        self._backend = backend  # track_with's wandb / mlflow / stdout sink (roll.tracking.backends), or None
        self.metrics_path = Path(output_dir) / METRICS_FILE
        self.metrics_path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is not None and self.metrics_path.exists():
            dropped = truncate_metrics(self.metrics_path, resume_step)
            log.info("resuming after step %d: dropped %d later metrics lines", resume_step, dropped)
        self._file = self.metrics_path.open("ab" if resume_step is not None else "wb", buffering=0)
        purge_step = None if resume_step is None else resume_step + 1
        self._writer = SummaryWriter(log_dir=os.fspath(logging_dir), purge_step=purge_step)

    def log(self, step: int, metrics: Mapping[str, Any]) -> dict[str, float]:
        """Record `metrics` at `step`; None values are skipped. Returns the floats written."""
        if "step" in metrics:
            raise ValueError("'step' is the record's own key; pass it as the step argument")
        values = {key: to_float(v) for key, v in metrics.items() if v is not None}
        record = {"step": int(step), **values}
        self._append_line((json.dumps(record) + "\n").encode())
        for key, value in values.items():
            self._writer.add_scalar(key, value, global_step=int(step))
        self._writer.flush()
        if self._backend is not None:
            self._backend.log(int(step), values)
        return values

    def log_config(self, config: Any) -> None:
        """The run's config (a mapping, or a pydantic model dumped as JSON values), once, to the
        `track_with` backend: wandb's run config, mlflow's params. Nothing without a backend."""
        if self._backend is None:
            return
        if hasattr(config, "model_dump"):
            config = config.model_dump(mode="json")
        self._backend.log_config(config)

    def _append_line(self, data: bytes) -> None:
        """One whole line or nothing: a write cut short (a full disk) is taken back before the
        error goes on, so metrics.jsonl never holds half a line."""
        before = self._file.tell()
        try:
            written = self._file.write(data)
            if written != len(data):
                raise OSError(errno.ENOSPC, f"wrote {written} of {len(data)} bytes", str(self.metrics_path))
        except OSError:
            os.ftruncate(self._file.fileno(), before)
            self._file.seek(before)  # a fresh run's file is not opened for appending
            raise

    def log_text(self, step: int, tag: str, text: str) -> None:
        """A text panel in TensorBoard (e.g. a rendered validation episode)."""
        self._writer.add_text(tag, text, global_step=int(step))
        self._writer.flush()

    def log_images(self, step: int, tag: str, images: Sequence[np.ndarray]) -> None:
        """Image panels in TensorBoard, `tag/0`, `tag/1`, ...: (H, W, 3) uint8 arrays (e.g. the
        frames a vision-language policy saw in a validation episode)."""
        for i, image in enumerate(images):
            self._writer.add_image(f"{tag}/{i}", image, global_step=int(step), dataformats="HWC")
        self._writer.flush()

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
        self._file.close()
        self._writer.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
