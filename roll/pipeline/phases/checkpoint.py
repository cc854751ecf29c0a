"""Crash-safe checkpoints under `output_dir/checkpoints/`.

`step_N/` is an ordinary HF model dir (the actor; loadable with `from_pretrained`) plus
`optimizer.pt`, `scheduler.pt`, `critic/` when there is a critic, and `trainer_state.json`.
A checkpoint is written into `.tmp-step_N/` and renamed into place only when complete; the file
`latest` (replaced atomically) then names it. A run killed at any moment therefore leaves either
the previous complete checkpoint or the new one, never a half-written directory that looks whole.

Bit rot, a full disk or a hand edit can still damage a committed checkpoint, so each one carries
`manifest.json` (every file's size and sha256), written last: before it, every data file is
fsynced, so the manifest never describes bytes that are not on disk yet. Resuming checks the
manifest (sizes first, then hashes) and, when a file does not match, falls back to the newest
intact checkpoint with one warning line naming the bad file, instead of a traceback from the
loader (torch's unpickler, safetensors, json). A checkpoint without a manifest (written before
manifests existed) is taken as complete when its state and config are there, as before.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

from roll.core.errors import BadConfig
from roll.utils.atomic import fsync_dir, write_atomic

STATE_FILE = "trainer_state.json"
LATEST_FILE = "latest"
MANIFEST_FILE = "manifest.json"
logger = logging.getLogger("roll")


class CheckpointDamaged(BadConfig, RuntimeError):
    """A checkpoint named explicitly (`resume_from_checkpoint: PATH`) is not intact; one line (a
    config error: the key names a checkpoint that cannot be resumed)."""


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
    write_atomic(tmp / STATE_FILE, json.dumps({"step": step, **state}, indent=2))
    write_atomic(tmp / MANIFEST_FILE, json.dumps(_manifest(tmp, fsync=True), indent=1))  # fsyncs tmp too
    final = checkpoint_root(output_dir) / f"step_{step}"
    old = final.with_name(f".old-{final.name}")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(tmp, final)
    fsync_dir(final.parent)
    write_atomic(checkpoint_root(output_dir) / LATEST_FILE, final.name)
    shutil.rmtree(old, ignore_errors=True)
    return final


def is_complete(path: Path) -> bool:
    return (path / STATE_FILE).is_file() and (path / "config.json").is_file()


def damage(path: Path) -> str | None:
    """Why the checkpoint at `path` cannot be trusted ("optimizer.pt: 12 bytes, the manifest says
    4096"), or None when it is intact (or has no manifest but is complete)."""
    if not is_complete(path):
        return f"{STATE_FILE} or config.json is missing"
    manifest_path = path / MANIFEST_FILE
    if not manifest_path.is_file():
        return None  # written before manifests: nothing to check it against
    try:
        expected = json.loads(manifest_path.read_text())["files"]
    except (ValueError, KeyError, TypeError):
        return f"{MANIFEST_FILE} is unreadable"
    for name, entry in expected.items():  # sizes first: cheap, and what truncation changes
        file = path / name
        if not file.is_file():
            return f"{name}: missing"
        if file.stat().st_size != entry["size"]:
            return f"{name}: {file.stat().st_size} bytes, the manifest says {entry['size']}"
    key = (str(path.resolve()), manifest_path.stat().st_mtime_ns)
    if key in _VERIFIED:  # hashed once in this process already (the CLI's pre-start check)
        return None
    for name, entry in expected.items():
        if _sha256(path / name) != entry["sha256"]:
            return f"{name}: its sha256 differs from the manifest's"
    _VERIFIED.add(key)
    return None


_VERIFIED: set[tuple[str, int]] = set()
"""Checkpoints whose files matched their manifest (path, manifest mtime): resuming checks a
checkpoint before Ray starts and again when the pipeline loads it; hashing gigabytes twice is waste."""


def candidates(output_dir: str) -> list[Path]:
    """Complete-looking checkpoints, newest first: the one `latest` names, then step_N by N."""
    root = checkpoint_root(output_dir)
    steps = sorted((p for p in root.glob("step_*") if _is_step(p) and is_complete(p)), key=lambda p: -int(p.name[5:]))
    named = _latest_named(root)
    if named is not None and named in steps:
        steps.remove(named)
        steps.insert(0, named)
    return steps


def _is_step(path: Path) -> bool:
    return path.name[5:].isdigit()


def _latest_named(root: Path) -> Path | None:
    marker = root / LATEST_FILE
    name = marker.read_text(errors="replace").strip() if marker.is_file() else ""
    return root / name if name else None


def dangling_latest(output_dir: str) -> str | None:
    """What is wrong with the checkpoint the `latest` file names ("step_7 does not exist"), or
    None when it names a complete checkpoint (or there is no `latest`)."""
    root = checkpoint_root(output_dir)
    named = _latest_named(root)
    if named is None:
        return None
    if not named.is_dir():
        return f"{root / LATEST_FILE} names {named.name}, which does not exist"
    if not is_complete(named):
        return f"{root / LATEST_FILE} names {named.name}, which is incomplete ({STATE_FILE} or config.json missing)"
    return None


def latest(output_dir: str) -> Path | None:
    """The newest intact checkpoint. Damaged ones newer than it are skipped with one warning
    line that names each one's bad file; a `latest` file naming a checkpoint that is not there
    is named in one warning too."""
    dangling = dangling_latest(output_dir)
    if dangling is not None:
        newest = next(iter(candidates(output_dir)), None)
        logger.warning("%s; looking for the newest intact checkpoint (%s)", dangling, newest.name if newest else "none")
    skipped: list[str] = []  # "step_3 (optimizer.pt: ...)"
    for path in candidates(output_dir):
        problem = damage(path)
        if problem is None:
            if skipped:
                logger.warning("damaged checkpoint skipped: %s; resuming from %s", "; ".join(skipped), path.name)
            return path
        skipped.append(f"{path.name} ({problem})")
    if skipped:
        logger.warning("damaged checkpoint skipped: %s; no intact checkpoint is left", "; ".join(skipped))
    return None


def resolve_resume(resume_from_checkpoint: bool | str, output_dir: str) -> Path | None:
    """`True` -> the latest complete checkpoint (None if there is none yet); a path -> that one."""
    if resume_from_checkpoint is False or resume_from_checkpoint in ("", None):
        return None
    if resume_from_checkpoint is True:
        return latest(output_dir)
    path = Path(resume_from_checkpoint)
    if not is_complete(path):
        raise CheckpointDamaged(f"resume_from_checkpoint: {path} is not a complete checkpoint")
    problem = damage(path)
    if problem is not None:
        raise CheckpointDamaged(f"resume_from_checkpoint: {path} is damaged ({problem})")
    return path


def prune(output_dir: str, keep: int) -> list[Path]:
    """Delete all but the newest `keep` complete checkpoints (`max_ckpt_to_keep`; 0 deletes none);
    returns the deleted paths. The one `latest` names is kept whatever its step. Called right after
    `commit`, whose checkpoint (intact by construction) is the one a resume reads, so that one is
    never deleted. Each deletion renames `step_N` to `.deleting-step_N` first (atomic), so a kill
    during the removal never leaves a half-deleted `step_N` that looks complete; leftovers of such a
    kill are removed by the next call."""
    root = checkpoint_root(output_dir)
    for leftover in root.glob(".deleting-step_*"):
        shutil.rmtree(leftover, ignore_errors=True)
    found = candidates(output_dir)  # newest first, the one `latest` names at the front
    if keep <= 0 or len(found) <= keep:
        return []
    deleted = []
    for path in found[keep:]:
        doomed = path.with_name(f".deleting-{path.name}")
        os.rename(path, doomed)
        fsync_dir(root)
        shutil.rmtree(doomed)
        deleted.append(path)
    return deleted


def read_state(path: Path) -> dict:
    return json.loads((path / STATE_FILE).read_text())


def _manifest(directory: Path, fsync: bool) -> dict:
    """Size and sha256 of every file under `directory` (the manifest itself excepted); with
    `fsync`, each file is flushed to disk first (the writers are other processes: an fsync on any
    descriptor of a file flushes its pages)."""
    files = {}
    for file in sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST_FILE):
        if fsync:
            fd = os.open(file, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        files[file.relative_to(directory).as_posix()] = {"size": file.stat().st_size, "sha256": _sha256(file)}
    for sub in (p for p in directory.rglob("*") if p.is_dir()):
        if fsync:
            fsync_dir(sub)
    return {"files": files}


def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
