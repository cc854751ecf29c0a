"""Files replaced whole: a reader, or a run killed at any moment, sees the old file or the new one,
never a mix, and once `write_atomic` returns the new one survives a crash of the machine.
`atomic_dir` does the same for a directory built whole (a model dir).

The data goes to `<name>.tmp` in the same directory (a rename is atomic only within one file
system), is flushed and fsynced, renamed over the file, and the directory is fsynced so that the
rename itself is on disk. A write that fails part-way removes its temporary file and leaves the
old file as it was.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def write_atomic(path: str | os.PathLike[str], data: str | bytes, *, encoding: str = "utf-8") -> Path:
    """Replace `path` with `data` (text is encoded with `encoding`), durably; see the module
    docstring. The parent directory must exist. Returns `path` as a Path."""
    path = Path(path)
    payload = data.encode(encoding) if isinstance(data, str) else data
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)
    return path


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make renames and new entries in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield a temporary sibling of `final` to fill; on success swap it in for `final`.

    A build killed half-way leaves only a hidden `.NAME.*.tmp` sibling, never a `final` dir that
    looks complete (has config.json) but lacks weights or tokenizer files.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        yield tmp
        if final.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".old", dir=final.parent))
            final.rename(old / final.name)
            tmp.rename(final)
            shutil.rmtree(old)
        else:
            tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already after a successful rename
