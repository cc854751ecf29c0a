"""`Sandbox`: one episode's workspace, and shell / Python commands run isolated inside it.

Contract: `Sandbox(limits, isolation="auto")` makes a fresh workspace folder (owned by the
sandbox uid when we are root); `write_file` / `read_file` move task files in and out from the
trusted side; `run_shell(cmd)` and `run_python(code)` run one command under the limits and give a
`CommandResult` whose `reason` names the first limit hit; `close()` kills anything left and
removes the workspace (also on `with` exit, garbage collection and interpreter exit; what a
process killed outright left is swept by the next sandbox made on the machine: janitor.py).
`info()` says which isolation ran and what it guarantees (`isolation.GUARANTEES`), and counts
violations by reason.
A command's violation never raises here: the caller (an env) decides what it costs.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import roll.agentic.sandbox.isolation as isolation
import roll.agentic.sandbox.janitor as janitor
from roll.agentic.sandbox.limits import CommandResult, SandboxLimits

LAUNCHER = str(Path(__file__).with_name("launcher.py"))
UID_BASE = 200_000  # sandbox uids: UID_BASE + (pid mod 2**20) * SLOTS + a slot; no user owns them
SLOTS = 1024  # sandboxes open at once in one process, each with a uid of its own
_live_slots: set[int] = set()
_slot_lock = threading.Lock()
_FINDINGS = (  # (reason, error text a refused attempt prints), checked in this order
    ("cpu_time", ("CPU time limit exceeded",)),
    ("memory", ("MemoryError", "Cannot allocate memory", "bad_alloc")),
    ("processes", ("Cannot fork", "fork: retry", "Resource temporarily unavailable", "BlockingIOError")),
    ("file_size", ("File too large",)),
    ("network", ("Network is unreachable", "[Errno 101]", "Cannot assign requested address")),
    ("write_outside", ("Read-only file system", "Permission denied")),
    ("signal_denied", ("Operation not permitted", "No such process")),
)


class Sandbox:
    """A workspace and an isolated runner of commands in it; see the module docstring."""

    def __init__(
        self,
        limits: SandboxLimits | dict | None = None,
        isolation_mode: str = "auto",
        root_dir: str | None = None,
    ) -> None:
        self.limits = SandboxLimits.of(limits)
        self.mode = isolation.choose_mode(isolation_mode)
        self.as_root = isolation.is_root()
        self._slot = _take_slot() if self.as_root else None
        self.uid = None if self._slot is None else UID_BASE + (os.getpid() % 2**20) * SLOTS + self._slot
        janitor.sweep(root_dir or tempfile.gettempdir(), _uids_of_pid)  # what killed processes left
        self._root = tempfile.mkdtemp(prefix=janitor.folder_prefix(), dir=root_dir)
        os.chmod(self._root, 0o711)
        self.workspace = os.path.join(self._root, "ws")
        os.mkdir(self.workspace, 0o755)
        os.mkdir(os.path.join(self.workspace, ".tmp"), 0o700)
        self._chown_tree(self.workspace)
        self.python = self._python()
        self.violations: Counter[str] = Counter()
        self.commands = 0
        self.strays_removed = 0  # files the sandbox uid left in world-writable folders (rlimits)
        self.closed = False
        janitor.track(self)

    # --- files, from the trusted side ------------------------------------------------------
    def path(self, relative: str) -> Path:
        target = Path(self.workspace, relative).resolve()
        if not target.is_relative_to(self.workspace):
            raise ValueError(f"{relative!r} is outside the workspace")
        return target

    def write_file(self, relative: str, text: str) -> None:
        target = self.path(relative)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink():  # the command may have planted a link to a file of ours
            target.unlink()
        target.write_text(text)
        self._chown_tree(self.workspace)

    def read_file(self, relative: str, max_bytes: int = 1 << 20) -> str | None:
        target = self.path(relative)
        if not target.is_file():
            return None
        with open(target, "rb") as f:
            return f.read(max_bytes).decode(errors="replace")

    # --- commands --------------------------------------------------------------------------
    def run_shell(self, command: str) -> CommandResult:
        return self.run(["/bin/sh", "-c", command])

    def run_python(self, code: str) -> CommandResult:
        return self.run([self.python, "-E", "-s", "-c", code])  # the workspace is importable

    def run(self, argv: list[str]) -> CommandResult:
        """Run `argv` in the workspace under the limits and isolation; never raises for what the
        command does."""
        if self.closed:
            raise RuntimeError("the sandbox is closed")
        self.commands += 1
        read_status, write_status = os.pipe()
        spec = self._spec(argv, write_status)
        prefix = isolation.unshare_prefix() if self.mode == "namespaces" else []
        start = time.monotonic()
        proc = subprocess.Popen(
            [*prefix, sys.executable, "-I", "-S", LAUNCHER, json.dumps(spec)],  # -S: no site, 3x faster start
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            pass_fds=(write_status,),
            start_new_session=True,
        )
        os.close(write_status)
        try:
            output, killed_for = self._collect(proc, start)
        finally:
            self._kill(proc)
            status = _read_status(read_status)
        result = self._result(output, killed_for, status, time.monotonic() - start, proc.returncode)
        if result.violation:
            self.violations[result.reason] += 1
        return result

    def info(self) -> dict:
        """Which isolation ran and what it guarantees, the limits, and the violations so far."""
        return {
            **isolation.guarantees(self.mode),
            "uid": self.uid,
            "limits": vars(self.limits).copy(),
            "commands": self.commands,
            "violations": dict(self.violations),
            "strays_removed": self.strays_removed,
        }

    def close(self) -> None:
        """Kill whatever of the sandbox uid still runs, and remove the workspace."""
        if self.closed:
            return
        self.closed = True
        if self.uid is not None:
            _kill_uid(self.uid)
            self.strays_removed += _remove_strays(self.uid)
        shutil.rmtree(self._root, ignore_errors=True)
        if self._slot is not None:
            with _slot_lock:
                _live_slots.discard(self._slot)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "closed", True):
            try:
                self.close()
            except Exception:  # noqa: BLE001 - at interpreter exit builtins may be gone
                pass

    # --- helpers ---------------------------------------------------------------------------
    def _python(self) -> str:
        """The interpreter of `run_python`: ours, unless the sandbox uid cannot reach it outside
        a mount namespace (then the system's python3, when there is one)."""
        if self.mode == "namespaces" or self.uid is None or isolation.reachable_by_others(sys.executable):
            return sys.executable
        system = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
        return system if system and isolation.reachable_by_others(system) else sys.executable

    def _chown_tree(self, top: str) -> None:
        if self.uid is None:
            return
        for folder, _, files in os.walk(top):
            for name in [folder, *(os.path.join(folder, f) for f in files)]:
                os.lchown(name, self.uid, self.uid)

    def _spec(self, argv: list[str], status_fd: int) -> dict:
        tmp = os.path.join(self.workspace, ".tmp")
        path = os.pathsep.join([os.path.dirname(self.python), "/usr/local/bin", "/usr/bin", "/bin"])
        env = {"PATH": path, "HOME": self.workspace, "TMPDIR": tmp, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
        nproc = self.limits.max_procs + (0 if self.uid is not None else _processes_of(os.getuid()))
        spec = {"mode": self.mode, "workspace": self.workspace, "argv": argv, "env": env, "uid": self.uid}
        spec |= {"nproc": nproc, "limits": vars(self.limits), "status_fd": status_fd}
        if self.mode == "namespaces":
            spec |= {"stage": os.path.join(self._root, "stage"), "expose": self._exposed()}
        return spec

    def _exposed(self) -> dict[str, list[str]]:
        return isolation.closed_ancestors([*isolation.interpreter_paths(), self.python])

    def _collect(self, proc: subprocess.Popen, start: float) -> tuple[bytes, str | None]:
        """Read the output up to `output_bytes` before the wall-clock deadline."""
        cap, deadline = self.limits.output_bytes, start + self.limits.wall_s
        chunks, size = [], 0
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return b"".join(chunks), "wall_time"
                if not sel.select(timeout=min(left, 0.5)):
                    continue
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    return b"".join(chunks), None
                chunks.append(chunk)
                size += len(chunk)
                if size > cap:
                    return b"".join(chunks)[:cap], "output"

    def _kill(self, proc: subprocess.Popen) -> None:
        """SIGKILL the launcher's process group and every descendant, then reap it."""
        for pid in [proc.pid, *_descendants(proc.pid)]:
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        try:
            proc.wait(timeout=max(5.0, self.limits.wall_s))
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not wait
            pass
        proc.stdout.close()
        if self.uid is not None:
            _kill_uid(self.uid)

    def _result(self, raw: bytes, killed_for: str | None, status: dict | None, wall: float, rc: int) -> CommandResult:
        text = raw.decode(errors="replace")
        status = status or {}
        sig = status.get("signal")
        if killed_for:
            reason = killed_for
        elif not status:
            reason = "parent_killed"  # the launcher died before it could report
        elif sig == signal.SIGXCPU or (sig == signal.SIGKILL and status["cpu_s"] >= self.limits.cpu_s):
            reason = "cpu_time"
        elif sig == signal.SIGXFSZ:
            reason = "file_size"
        else:
            found = [name for name, marks in _FINDINGS if any(m in text for m in marks)]
            exit_code = status.get("exit_code")  # a refused attempt counts even when the command goes on
            reason = found[0] if found else ("ok" if exit_code == 0 else "exit_code")
        return CommandResult(
            output=text,
            exit_code=status.get("exit_code"),
            reason=reason,
            wall_s=round(wall, 3),
            cpu_s=float(status.get("cpu_s", 0.0)),
            leftover_processes=int(status.get("leftover_processes", 0)),
            signal=sig,
            details={"launcher_returncode": rc},
        )


def _uids_of_pid(pid: int) -> range:
    """The sandbox uids a process of this pid hands out (see `Sandbox.uid`)."""
    first = UID_BASE + (pid % 2**20) * SLOTS
    return range(first, first + SLOTS)


def _take_slot() -> int:
    """The lowest slot no open sandbox of this process holds (so no two share a uid)."""
    with _slot_lock:
        free = next((slot for slot in range(SLOTS) if slot not in _live_slots), None)
        if free is None:
            raise RuntimeError(f"more than {SLOTS} sandboxes open at once in one process")
        _live_slots.add(free)
        return free


def _read_status(fd: int) -> dict | None:
    with os.fdopen(fd, "rb") as f:
        line = f.read().decode(errors="replace").strip()
    try:
        return json.loads(line) if line else None
    except json.JSONDecodeError:
        return None


def _proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, real uid) of every live process we can see (zombies are dead already)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            if not fields["State"].strip().startswith("Z"):
                table[int(entry)] = (int(fields["PPid"]), int(fields["Uid"].split()[0]))
        except (OSError, KeyError, ValueError):
            continue
    return table


def _descendants(root: int) -> list[int]:
    table = _proc_table()
    found, frontier = [], {root}
    while frontier:
        frontier = {pid for pid, (ppid, _) in table.items() if ppid in frontier}
        found += sorted(frontier)
    return found


def _pids_of(uid: int) -> list[int]:
    """Live processes whose real uid is `uid` (from /proc/PID/status: after a setuid a process
    is not dumpable and its /proc folder stays root's, so the folder's owner would miss it)."""
    return [pid for pid, (_, owner) in _proc_table().items() if owner == uid]


def _processes_of(uid: int) -> int:
    return len(_pids_of(uid))


WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm")


def _remove_strays(uid: int) -> int:
    """Remove what `uid` made at the top of the world-writable folders; how many entries."""
    removed = 0
    for folder in sorted({*WORLD_WRITABLE, tempfile.gettempdir()}):
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
                removed += 1
            except OSError:
                continue
    return removed


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of `uid` until none is left (a sandbox uid owns nothing else)."""
    for _ in range(100):
        pids = _pids_of(uid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)
