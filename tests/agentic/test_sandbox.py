"""The sandbox contains escape attempts under every isolation this machine can give.

Each isolation runs the same attempts (tests/lanes/sandbox_escapes.py): the network (refused
under rlimits too where the seccomp filter installs), a write
outside the workspace, a fork bomb, endless output, sleeping forever, killing its parent, a CPU
burn, a memory hog and a daemon that outlives its command. Each must be contained, named by the
result's `reason`, counted in `info()["violations"]`, and leave no process and no workspace.
"namespaces" and the dedicated-uid "rlimits" need root; the caller-uid "rlimits" runs in-process
when we are not root, and as root under `setpriv` as nobody (with the system python3).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from roll.agentic.sandbox import Sandbox, SandboxLimits
from roll.agentic.sandbox.isolation import namespaces_available, seccomp_available

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parents[1] / "lanes" / "sandbox_escapes.py"
NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="this isolation needs root")


@pytest.fixture
def listener():
    """A loopback listener; the test checks that no sandboxed command ever reached it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    yield sock
    sock.close()


def _accepted(sock: socket.socket) -> bool:
    try:
        sock.accept()[0].close()
        return True
    except BlockingIOError:
        return False


def _run_escapes(mode: str, port: int, *, as_nobody: bool = False) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, str(SCRIPT), mode, str(port)]
    if as_nobody:
        python = shutil.which("python3", path="/usr/bin:/bin")
        if python is None or not shutil.which("setpriv"):
            pytest.skip("needs /usr/bin/python3 and setpriv to run as nobody")
        argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", python, *argv[1:]]
        env["HOME"] = "/tmp"
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=240, cwd="/tmp")
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _processes_of(uid: int) -> list[int]:
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields["Uid"].split()[0]) == uid and not fields["State"].strip().startswith("Z"):
            pids.append(int(entry))
    return pids


def _check_common(report: dict) -> dict:
    """What every isolation guarantees; returns the results by case."""
    results, info = report["results"], report["info"]
    assert results["workspace_write"]["reason"] == "ok" and results["workspace_write"]["exit_code"] == 0
    assert results["fork_bomb"]["reason"] == "processes"
    assert results["endless_output"]["reason"] == "output"
    assert results["endless_output"]["output_len"] <= 4096
    assert results["sleep_forever"]["reason"] == "wall_time"
    assert results["cpu_burn"]["reason"] == "cpu_time"
    assert results["memory_hog"]["reason"] == "memory"
    assert results["daemon"]["leftover_processes"] >= 1  # found and killed by the launcher
    counted = info["violations"]
    for case in ("fork_bomb", "endless_output", "sleep_forever", "cpu_burn", "memory_hog"):
        assert counted[results[case]["reason"]] >= 1, case
    assert not Path(report["workspace"]).exists()
    assert not Path(report["outside"]).exists()
    return results


def _check_network(report: dict, listener: socket.socket) -> None:
    """rlimits: no network where the seccomp filter installs (as here: `seccomp_available`), else
    the loopback listener is reached, and the report says which."""
    info, network = report["info"], report["results"]["network"]
    assert info["seccomp"] is (seccomp_available() is None)
    if info["seccomp"]:  # every socket but a unix one refused
        assert info["network_isolated"] is True and "network" not in info["open"]
        assert network["reason"] == "network" and not _accepted(listener)
    else:  # reported, not assumed: loopback is reachable
        assert info["network_isolated"] is False and "network" in info["open"]
        assert network["reason"] == "ok" and _accepted(listener)


@needs_root
@pytest.mark.skipif(bool(namespaces_available()), reason=f"no namespaces here: {namespaces_available()}")
def test_namespaces_contain_every_escape(listener):
    report = _run_escapes("namespaces", listener.getsockname()[1])
    results = _check_common(report)
    info = report["info"]
    assert info["isolation"] == "namespaces" and info["network_isolated"] is True
    assert results["network"]["reason"] == "network"  # no interface at all, not even loopback
    assert not _accepted(listener)
    assert results["write_outside"]["reason"] == "write_outside"
    assert "Read-only file system" in results["write_outside"]["output"]
    assert results["write_shared"]["reason"] == "write_outside" and not report["shared_left"]
    assert results["kill_parent"]["reason"] == "signal_denied"
    assert "survived" in results["kill_parent"]["output"]
    assert _processes_of(info["uid"]) == []


@needs_root
def test_rlimits_as_root_run_a_uid_of_their_own(listener):
    report = _run_escapes("rlimits", listener.getsockname()[1])
    results = _check_common(report)
    info = report["info"]
    assert info["isolation"] == "rlimits" and info["filesystem"] == "uid"
    _check_network(report, listener)
    assert results["write_outside"]["reason"] == "write_outside"
    assert "Permission denied" in results["write_outside"]["output"]
    # /dev/shm is world-writable: the write succeeds, and the file is removed at close
    assert results["write_shared"]["reason"] == "ok" and not report["shared_left"]
    assert info["strays_removed"] >= 1
    assert results["kill_parent"]["reason"] == "signal_denied"
    assert _processes_of(info["uid"]) == []


def test_rlimits_without_root_contain_runaways(listener):
    as_nobody = os.geteuid() == 0
    report = _run_escapes("auto", listener.getsockname()[1], as_nobody=as_nobody)
    results = _check_common(report)
    info = report["info"]
    assert info["isolation"] == "rlimits" and info["as_root"] is False and info["uid"] is None
    assert info["filesystem"] == "permissions" and info["pid"] == "none"
    assert results["write_outside"]["reason"] == "write_outside"  # "/" is root's
    _check_network(report, listener)
    # the command may kill its launcher (same uid): that is caught and named, and we live on
    assert results["kill_parent"]["reason"] == "parent_killed"
    # without root nothing tells the sandbox's files in /dev/shm from the caller's: left (documented)
    assert results["write_shared"]["reason"] == "ok" and report["shared_left"]
    Path(report["shared"]).unlink()
    if as_nobody:
        assert _processes_of(NOBODY) == []


def test_limits_are_checked_by_name():
    with pytest.raises(ValueError, match="wall_s"):
        SandboxLimits(wall_s=0)
    with pytest.raises(TypeError, match="wal_s"):
        SandboxLimits.of({"wal_s": 1})


def test_files_move_in_and_out_and_paths_stay_inside():
    with Sandbox({"wall_s": 5}) as sandbox:
        sandbox.write_file("pkg/a.py", "X = 41\n")
        result = sandbox.run_python("import sys; sys.path.insert(0, '.'); from pkg.a import X; print(X + 1)")
        assert (result.reason, result.output.strip()) == ("ok", "42")
        assert sandbox.run_shell("echo hi > out.txt").reason == "ok"
        assert sandbox.read_file("out.txt") == "hi\n"
        with pytest.raises(ValueError, match="outside the workspace"):
            sandbox.write_file("../escape.txt", "x")
        workspace = sandbox.workspace
    assert not os.path.exists(workspace)
    with pytest.raises(RuntimeError, match="closed"):
        sandbox.run_shell("true")


def wait_for_uid(pid: int, uid: int, timeout_s: float = 10.0) -> None:
    """Until process `pid` runs as real uid `uid` (its /proc status says so)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/status") as status:
            if any(line.split()[:2] == ["Uid:", str(uid)] for line in status):
                return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never ran as uid {uid}")


@needs_root
def test_open_sandboxes_never_share_a_uid_so_closing_one_spares_the_other():
    first, second = Sandbox({"wall_s": 5}), Sandbox({"wall_s": 5})
    assert first.uid != second.uid
    survivor = subprocess.Popen(
        ["setpriv", f"--reuid={second.uid}", f"--regid={second.uid}", "--clear-groups", "sleep", "30"]
    )
    try:
        wait_for_uid(survivor.pid, second.uid)  # under load setpriv may not have switched yet
        first.close()
        assert survivor.poll() is None  # second's uid untouched by first's cleanup
        second.close()
        assert survivor.wait(timeout=10) == -9  # ... and killed by its own
    finally:
        survivor.kill()
        survivor.wait()
    third = Sandbox()
    assert third.uid in (first.uid, second.uid)  # slots are reused once free
    third.close()


_KILLED_MIDWAY = """
import os, sys, threading, time
from roll.agentic.sandbox import Sandbox
box = Sandbox({"wall_s": 60}, isolation_mode=sys.argv[1])
print(box._root, box.uid, flush=True)
threading.Thread(target=box.run_shell, args=("sleep 100000",), daemon=True).start()
time.sleep(2)
os._exit(0)  # killed outright: no close(), no atexit
"""


@needs_root
@pytest.mark.parametrize("mode", ["rlimits", "namespaces"])
def test_what_a_killed_process_left_is_swept_by_the_next_sandbox(mode):
    if mode == "namespaces" and namespaces_available():
        pytest.skip(f"no namespaces here: {namespaces_available()}")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _KILLED_MIDWAY, mode], capture_output=True, text=True, env=env, timeout=60
    )
    folder, uid = done.stdout.split()
    assert Path(folder).exists() and _processes_of(int(uid))  # its command still runs, orphaned
    Sandbox().close()
    assert not Path(folder).exists() and _processes_of(int(uid)) == []
