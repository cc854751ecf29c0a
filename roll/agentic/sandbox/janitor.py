"""What a killed process's sandboxes left behind, found and removed by the next sandbox.

A sandbox's folder is named `roll-sandbox-<pid>-...` after the process that made it. `close()`
removes it, and so does an `atexit` hook for sandboxes still open when the interpreter exits.
A process killed outright (an env worker at the end of a run) runs neither: `sweep(folder)`,
called whenever a sandbox is made, removes the folders of processes that no longer run, after
killing any process still running under the uids of that process's sandboxes (the rlimits
isolation as root; a pid namespace dies with its launcher on its own).
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import weakref

PREFIX = "roll-sandbox-"
_FOLDER = re.compile(rf"^{PREFIX}(\d+)-")
_open: weakref.WeakSet = weakref.WeakSet()


def folder_prefix() -> str:
    return f"{PREFIX}{os.getpid()}-"


def track(sandbox) -> None:
    """Close `sandbox` at interpreter exit if nobody closed it before."""
    _open.add(sandbox)


@atexit.register
def _close_open() -> None:
    for sandbox in list(_open):
        try:
            sandbox.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep(folder: str, uids_of_pid) -> int:
    """Remove the sandbox folders in `folder` whose making process is gone (killing first every
    process whose real uid is in `uids_of_pid(pid)`); how many were removed."""
    removed = 0
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    for name in names:
        match = _FOLDER.match(name)
        if match is None or _alive(int(match.group(1))):
            continue
        _kill_uids(uids_of_pid(int(match.group(1))))
        shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
        removed += 1
    return removed


def _kill_uids(uids: range) -> None:
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/status") as f:
                uid = next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
            if uid in uids:
                os.kill(int(entry), signal.SIGKILL)
        except (OSError, StopIteration, ValueError):
            continue
