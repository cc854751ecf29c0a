"""`roll.pipeline.failures.reaper`: the processes a driver started end with it, even after a `kill -9`,
and the watcher touches nothing else."""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]

DRIVER = textwrap.dedent("""
    import subprocess, sys, time
    from roll.pipeline.failures import reaper
    reaper.start(period_s=0.2, grace_s=1.0)
    # a grandchild in its own session that ignores SIGTERM: only the SIGKILL step ends it
    stubborn = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(300)"],
        start_new_session=True, stdout=subprocess.PIPE)
    stubborn.stdout.readline()
    plain = subprocess.Popen(["sleep", "300"], start_new_session=True)
    print(stubborn.pid, plain.pid, flush=True)
    time.sleep(300)
""")


def _env() -> dict[str, str]:
    return os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def test_a_killed_drivers_processes_are_ended_and_an_outsider_is_not():
    outsider = subprocess.Popen(["sleep", "300"])  # not the driver's: must survive
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True, env=_env())
    try:
        pids = [int(p) for p in driver.stdout.readline().split()]
        procs = [psutil.Process(p) for p in pids]
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=10)
        _, left = psutil.wait_procs(procs, timeout=30)
        assert left == []
        assert outsider.poll() is None
    finally:
        outsider.kill()
        for pid in pids if "pids" in locals() else []:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_the_watcher_works_only_on_its_drivers_pipe():
    proc = subprocess.run(
        [sys.executable, "-m", "roll.pipeline.failures.reaper", "1", "t", "0.1", "0.1"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
    )
    assert proc.returncode == 1
    assert "stdin is not the driver's pipe" in proc.stderr


NESTED = textwrap.dedent("""
    import subprocess, sys, time
    from roll.pipeline.failures import reaper
    reaper.start(period_s=0.2, grace_s=1.0)
    inner = subprocess.Popen([sys.executable, "-c", "from roll.pipeline.failures import reaper; import time; "
                              "w = reaper.start(period_s=0.2, grace_s=1.0); print(w.pid, flush=True); time.sleep(300)"],
                             stdout=subprocess.PIPE)
    watcher = int(inner.stdout.readline())
    sibling = subprocess.Popen(["sleep", "300"])
    print(inner.pid, watcher, sibling.pid, flush=True)
    time.sleep(300)
""")


def test_a_run_started_inside_another_does_not_end_its_parent_when_it_ends():
    outer = subprocess.Popen([sys.executable, "-c", NESTED], stdout=subprocess.PIPE, text=True, env=_env())
    try:
        inner, watcher, sibling = (int(p) for p in outer.stdout.readline().split())
        watching = psutil.Process(watcher)
        os.kill(inner, signal.SIGKILL)
        watching.wait(timeout=60)  # the inner run's watcher has done its work and gone
        assert outer.poll() is None and psutil.Process(sibling).status() != psutil.STATUS_ZOMBIE
    finally:
        outer.kill()
