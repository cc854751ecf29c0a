"""A full disk in the middle of a run: recognised, cleaned up after, and said in one line.

The disk can fill while a worker writes a checkpoint (the error comes back as a `RayTaskError`
wrapping an `OSError` or safetensors' own error, whose text carries the OS's "No space left on
device") or while the driver writes a checkpoint's state, a metrics line or a trace (an `OSError`
with `errno.ENOSPC`). `is_disk_full` knows both. The pipeline then deletes the half-written
checkpoint (`.tmp-step_N`, which would only hold space) and raises `DiskFull`, whose message names
the directory, the space one checkpoint needs and the last intact checkpoint; the CLI prints it
and exits 1. Earlier checkpoints are never touched by a failed save (`roll.pipeline.phases.checkpoint`
writes aside and renames), and metrics.jsonl loses no line it had (`roll.tracking.tracker`).
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from roll.core.errors import RunStopped

NO_SPACE_TEXT = ("No space left on device", "ENOSPC", "Disk quota exceeded")


class DiskFull(RunStopped, RuntimeError):
    """The run stopped because a directory it writes ran out of space; one line."""


def is_disk_full(err: BaseException | None) -> bool:
    """Whether `err`, or an exception it was raised from, is a full disk (or quota)."""
    seen = 0
    while err is not None and seen < 10:
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(text in str(err) for text in NO_SPACE_TEXT):
            return True
        err, seen = err.__cause__ or err.__context__, seen + 1
    return False


def disk_full_line(directory: str | Path, need_bytes: int | None, last_checkpoint: Path | None) -> str:
    """The one line a full disk is reported with."""
    free = shutil.disk_usage(_existing(Path(directory))).free
    need = f"; one checkpoint needs about {size_text(need_bytes)}" if need_bytes else ""
    last = last_checkpoint.name if last_checkpoint is not None else "none"
    return (
        f"no space left on device in {directory} ({size_text(free)} free{need}); the last checkpoint ({last}), "
        "metrics and events are intact: free space and resume with resume_from_checkpoint=true"
    )


def size_text(n: float) -> str:
    """1536 -> "1.5 KiB"."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path
