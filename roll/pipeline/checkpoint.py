"""Crash-safe checkpoints under `output_dir/checkpoints/`.

`step_N/` is an ordinary HF model dir (the actor; loadable with `from_pretrained`) plus
`optimizer.pt`, `scheduler.pt`, `critic/` when there is a critic, and `trainer_state.json`.
A checkpoint is written into `.tmp-step_N/` and renamed into place only when complete; the file
`latest` (replaced atomically) then names it. A run killed at any moment therefore leaves either
the previous complete checkpoint or the new one, never a half-written directory that looks whole.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

STATE_FILE = "trainer_state.json"
LATEST_FILE = "latest"


def checkpoint_root(output_dir: str) -> Path:
    return Path(output_dir) / "checkpoints"


def begin(output_dir: str, step: int) -> Path:
    """A fresh temporary directory to write checkpoint `step` into."""
    tmp = checkpoint_root(output_dir) / f".tmp-step_{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def commit(output_dir: str, tmp: Path, step: int, state: dict) -> Path:
    """Write the trainer state last, rename into place, then point `latest` at it. An existing
    `step_N` (a resumed run saving a step again) is renamed aside before, and deleted after, so a
    kill never leaves a half-deleted `step_N` that still looks complete."""
    _write_atomic(tmp / STATE_FILE, json.dumps({"step": step, **state}, indent=2))
    final = checkpoint_root(output_dir) / f"step_{step}"
    old = final.with_name(f".old-{final.name}")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(tmp, final)
    _write_atomic(checkpoint_root(output_dir) / LATEST_FILE, final.name)
    shutil.rmtree(old, ignore_errors=True)
    return final


def is_complete(path: Path) -> bool:
    return (path / STATE_FILE).is_file() and (path / "config.json").is_file()


def latest(output_dir: str) -> Path | None:
    """The newest complete checkpoint: the one `latest` names, else the highest complete step_N."""
    root = checkpoint_root(output_dir)
    marker = root / LATEST_FILE
    if marker.is_file():
        candidate = root / marker.read_text().strip()
        if is_complete(candidate):
            return candidate
    steps = sorted((p for p in root.glob("step_*") if is_complete(p)), key=lambda p: int(p.name[5:]))
    return steps[-1] if steps else None


def resolve_resume(resume_from_checkpoint: bool | str, output_dir: str) -> Path | None:
    """`True` -> the latest complete checkpoint (None if there is none yet); a path -> that one."""
    if resume_from_checkpoint is False or resume_from_checkpoint in ("", None):
        return None
    if resume_from_checkpoint is True:
        return latest(output_dir)
    path = Path(resume_from_checkpoint)
    if not is_complete(path):
        raise FileNotFoundError(f"resume_from_checkpoint: {path} is not a complete checkpoint")
    return path


def read_state(path: Path) -> dict:
    return json.loads((path / STATE_FILE).read_text())


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
