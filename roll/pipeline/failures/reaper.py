"""The processes a run started end with it, however the run ends.

A local Ray instance is a tree under the driver: `gcs_server` and `raylet` are its children, the
workers and Ray's two agents (dashboard agent, runtime-env agent) the raylet's. After a `kill -9`
of the driver, GCS, raylet and workers go within seconds, but each agent, seeing its raylet gone,
first tries to report that to the (already dead) GCS with a 60 s timeout (Ray 2.60,
`ray._private.process_watcher.report_raylet_error_logs`), so they linger about a minute; longer on
a loaded machine.

`start()` (called before `ray.init`) runs a small watcher process beside the driver. It reads one
pipe whose write end only the driver holds: end of file means the driver is gone, by any death, at
once. The driver's processes are found two ways: a token in the environment (`ROLL_RUN_TOKEN`,
set in the driver by `start()` and inherited by everything started after it, Ray's workers
included) and the driver's descendants noted every `period_s` (pid and start time, so a reused pid
is never hit; this finds a process that dropped its environment). Once the driver is gone the
watcher sends SIGTERM to those still alive, and SIGKILL to any left after `grace_s`. Only the
processes of this driver are touched, never Ray processes of other runs on the machine.
"""

from __future__ import annotations

import os
import select
import signal
import stat
import subprocess
import sys
import time
import uuid

import psutil

TOKEN_VAR = "ROLL_RUN_TOKEN"
_watcher: subprocess.Popen | None = None


def start(period_s: float = 1.0, grace_s: float = 3.0) -> subprocess.Popen:
    """Start the watcher for this process (once per process; later calls return the same one)."""
    global _watcher
    if _watcher is not None and _watcher.poll() is None:
        return _watcher
    # a fresh token, never an inherited one: a run started from another run's process (a test, a
    # notebook) must not end its parent's processes with its own
    token = os.environ[TOKEN_VAR] = uuid.uuid4().hex
    # its own session: a Ctrl-C to the driver's process group must not end the watcher first
    _watcher = subprocess.Popen(
        [sys.executable, "-m", "roll.pipeline.failures.reaper", str(os.getpid()), token, str(period_s), str(grace_s)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    return _watcher


def _start_times(procs, keep=lambda proc: True) -> dict[int, float]:
    """pid -> start time of each process of `procs` that `keep` accepts (gone ones are skipped)."""
    found = {}
    for proc in procs:
        try:
            if keep(proc):
                found[proc.pid] = proc.create_time()
        except psutil.Error:  # gone, or another user's
            continue
    return found


def descendants(pid: int, exclude: int) -> dict[int, float]:
    """pid -> start time of every live descendant of `pid`, without `exclude` (the watcher)."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return {}
    return _start_times(children, lambda proc: proc.pid != exclude)


def carrying(token: str, exclude: int) -> dict[int, float]:
    """pid -> start time of every process whose environment holds `TOKEN_VAR=token`."""
    return _start_times(
        psutil.process_iter(), lambda proc: proc.pid != exclude and proc.environ().get(TOKEN_VAR) == token
    )


def end(processes: dict[int, float], grace_s: float) -> None:
    """SIGTERM each process still alive with the same start time, SIGKILL those left after
    `grace_s`."""
    alive = []
    for pid, created in processes.items():
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == created:
                proc.send_signal(signal.SIGTERM)
                alive.append(proc)
        except psutil.Error:
            continue
    _, stubborn = psutil.wait_procs(alive, timeout=grace_s)
    for proc in stubborn:
        try:
            proc.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(stubborn, timeout=grace_s)


def watch(driver: int, token: str, period_s: float, grace_s: float) -> None:
    """The watcher's loop (module docstring): note descendants until the pipe ends, then end them."""
    if not stat.S_ISFIFO(os.fstat(sys.stdin.fileno()).st_mode):
        raise SystemExit("reaper: stdin is not the driver's pipe; nothing is watched")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    me, known = os.getpid(), {}
    while True:
        if os.getppid() == driver:  # its tree is the driver's only while the driver is alive
            known.update(descendants(driver, exclude=me))
        ready, _, _ = select.select([sys.stdin], [], [], period_s)
        if ready and not os.read(sys.stdin.fileno(), 4096):
            break
        if not psutil.pid_exists(driver):  # a forked child may still hold the pipe's write end
            break
    time.sleep(0.2)  # a clean shutdown may still be ending its processes; they go on their own
    end(known | carrying(token, exclude=me), grace_s)


if __name__ == "__main__":
    watch(int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))
