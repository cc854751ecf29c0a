"""The sandbox red team: 43 attempts beyond test_sandbox.py's ten, under each isolation this
machine offers, each a test.

tests/lanes/sandbox_red_team.py makes the attempts, one process per isolation level: as root for
"namespaces" and the dedicated-uid "rlimits"; for the caller-uid "rlimits" as a uid of its own
(setpriv, the system python3) when we are root, as ourselves otherwise. `EXPECTED` says what each
level must give: "contained: how", or "open: item" where item is what the sandbox reports in
`info()["open"]` and names in its start-up warning. An open attempt must really get through (a
test fails when the sandbox starts to contain it, so that the report and the docs follow), and
every item a level reports open is shown open by some attempt. docs/sandbox.md's red-team table
is this table.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from roll.agentic.sandbox import Sandbox
from roll.agentic.sandbox.isolation import namespaces_available, ptrace_scope, seccomp_available

ROOT = Path(__file__).resolve().parents[2]
LANE = ROOT / "tests" / "lanes" / "sandbox_red_team.py"
LEVELS = ("namespaces", "rlimits_root", "rlimits_user")
HEADERS = ("namespaces", "rlimits as root", "rlimits without root")

_PID_NS, _UID = "contained: pid namespace", "contained: another uid"
_NO_NET = "contained: no network (network namespace)"
_SECCOMP = "contained: seccomp refuses every socket but a unix one"
_ALL = {
    "symlink": "contained: reached with O_NOFOLLOW from the workspace down: the link is replaced, never followed",
    "fifo": "contained: opened non-blocking, read only as a regular file, replaced on write",
    "daemon": ("contained: the pid namespace dies", "contained: every process of its uid killed"),
    "grader": "contained: the verdict is reached outside the sandbox",
}
EXPECTED: dict[str, tuple[str, str, str]] = {
    # secrets of the host's processes
    "token_in_env": ("contained: scrubbed environment",) * 3,
    "launcher_environ": (
        "contained: the launcher runs as root",
        "contained: the launcher runs as root",
        "contained: the launcher starts with a scrubbed environment",
    ),
    "proc_environ": (_PID_NS, _UID, "open: same_uid_processes"),
    "proc_cmdline": (_PID_NS, "open: process_list", "open: process_list"),
    "proc_cwd": (_PID_NS, _UID, "open: same_uid_processes"),
    "ptrace_host": (_PID_NS, _UID, "open: ptrace"),
    "signal_host": (_PID_NS, _UID, "open: same_uid_processes"),
    "kill_everything": (_PID_NS, _UID, "open: same_uid_processes"),
    # other episodes, host files
    "other_workspace_read": (
        "contained: the host's /tmp hidden",
        "contained: workspaces are 0700, each of its own uid",
        "open: other_workspaces",
    ),
    "other_workspace_write": (
        "contained: the host's /tmp hidden",
        "contained: workspaces are 0700, each of its own uid",
        "open: other_workspaces",
    ),
    "read_ssh_key": (
        "contained: the host's /tmp and /root hidden",
        "contained: another uid (a 0700 home)",
        "open: host_files",
    ),
    "read_training_code": ("contained: the training code hidden", "open: host_files", "open: host_files"),
    "read_host_file": ("open: host_files", "open: host_files", "open: host_files"),
    "dev_shm_private": ("contained: the host's /dev/shm hidden", "contained: another uid", "open: host_files"),
    "shared_tmp_write": (
        "contained: the host's /tmp hidden, read-only",
        "open: shared_folders",
        "open: shared_folders",
    ),
    # links the trusted side might follow
    "symlink_read": (_ALL["symlink"],) * 3,
    "symlink_write": (_ALL["symlink"],) * 3,
    "symlink_dir_write": (_ALL["symlink"],) * 3,
    "hardlink_write": (
        "contained: the host's /tmp hidden",
        "contained: the kernel refuses the link (protected_hardlinks); else it is unlinked before writing",
        "contained: the link is unlinked before writing",
    ),
    "hardlink_read": (
        "contained: the host's /tmp hidden",
        "contained: the kernel refuses the link (protected_hardlinks); else a file of two names is not read",
        "contained: a file of two names is not read",
    ),
    "fifo_trap": (_ALL["fifo"],) * 3,
    "chmod_lockout": (
        "contained: root ignores file modes",
        "contained: root ignores file modes",
        "contained: the owner's modes are given back before writing and removal",
    ),
    # the network and local sockets
    "loopback_proxy": (_NO_NET, _SECCOMP, _SECCOMP),
    "loopback_port_scan": (_NO_NET, _SECCOMP, _SECCOMP),
    "udp_exfil": (_NO_NET, _SECCOMP, _SECCOMP),
    "ipv6_loopback": (_NO_NET, _SECCOMP, _SECCOMP),
    "unix_socket_shared": ("contained: the host's /tmp hidden", "open: unix_sockets", "open: unix_sockets"),
    "unix_socket_private": (
        "contained: the host's /tmp hidden",
        "contained: another uid (the socket is not writable)",
        "open: unix_sockets",
    ),
    "abstract_unix": ("contained: network namespace", "open: unix_sockets", "open: unix_sockets"),
    "sysv_shm": ("contained: IPC namespace", "open: sysv_ipc", "open: sysv_ipc"),
    # processes that try to stay
    "double_fork_daemon": (*_ALL["daemon"], "contained: the launcher, a subreaper, kills its descendants"),
    "fork_rabbit": (*_ALL["daemon"], "contained: the launcher, a subreaper, kills its descendants"),
    "close_stdout": ("contained: the wall-clock limit",) * 3,
    # resources
    "disk_fill": ("contained: disk_mb, measured every 0.05 s",) * 3,
    "inode_fill": ("contained: disk_mb, 4 KiB an entry",) * 3,
    "invalid_utf8": ("contained: decoded with replacement characters",) * 3,
    "huge_line": ("contained: output_bytes",) * 3,
    # privileges
    "setuid_root": (
        "contained: a uid of its own, no capabilities",
        "contained: a uid of its own, no capabilities",
        "contained: the caller's uid, no capabilities",
    ),
    "mount": ("contained: no CAP_SYS_ADMIN; a user namespace's mounts are its own",) * 3,
    # the grader
    "grader_spoof_marker": (_ALL["grader"],) * 3,
    "grader_spoof_equal": ("contained: only plain values are compared (ast.literal_eval)",) * 3,
    "grader_spoof_shadow": ("contained: the runner is python -I",) * 3,
    "grader_spoof_files": ("contained: the grader reads only its marked line",) * 3,
}


def lane_attempts() -> dict[str, str]:
    """name -> what it tries, from the lane."""
    spec = importlib.util.spec_from_file_location("sandbox_red_team", LANE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {name: what for name, (what, _) in module.ATTEMPTS.items()}


def expected(name: str, level: str) -> str:
    """EXPECTED, for this machine: without the seccomp filter rlimits has the network; under
    Yama >= 1 a non-descendant's memory is refused."""
    cell = EXPECTED[name][LEVELS.index(level)]
    if cell == _SECCOMP and seccomp_available():
        return "open: network"
    if cell == "open: ptrace" and ptrace_scope() >= 1:
        return "contained: Yama ptrace_scope >= 1"
    return cell


# --- running the lane -----------------------------------------------------------------------
_reports: dict[tuple[str, str], dict] = {}


def _own_uid() -> int:
    """A uid no process runs as (for the caller-uid level when we are root)."""
    taken = {
        os.stat(f"/proc/{p}").st_uid for p in filter(str.isdigit, os.listdir("/proc")) if os.path.exists(f"/proc/{p}")
    }
    return next(uid for uid in range(170_000 + os.getpid() % 20_000, 199_999) if uid not in taken)


def _argv(level: str, names: list[str]) -> tuple[list[str], dict, int | None]:
    """The lane's command line for `level`, its environment and the uid it runs as (None: ours)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    mode = "namespaces" if level == "namespaces" else "rlimits"
    if level in ("namespaces", "rlimits_root"):
        if os.geteuid() != 0:
            pytest.skip(f"{level} needs root (CI runs without it)")
        if level == "namespaces" and namespaces_available():
            pytest.skip(f"no namespaces here: {namespaces_available()}")
        return [sys.executable, str(LANE), mode, *names], env, None
    if os.geteuid() != 0:
        return [sys.executable, str(LANE), mode, *names], env, None
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None or not shutil.which("setpriv"):
        pytest.skip("rlimits without root, run by root, needs /usr/bin/python3 and setpriv to run as another uid")
    uid = _own_uid()
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "PYTHONPATH": str(ROOT), "LANG": "C.UTF-8"}
    setpriv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    return [*setpriv, python, str(LANE), mode, *names], env, uid


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


def _remove_files_of(uid: int) -> None:
    """What a lane killed outright left in /tmp (its folders are named roll-rt-* and roll-sandbox-*)."""
    for entry in os.scandir("/tmp"):
        if not entry.name.startswith(("roll-rt-", "roll-sandbox-")) or entry.stat(follow_symlinks=False).st_uid != uid:
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            os.unlink(entry.path)


def _gone(uid: int, timeout_s: float = 5.0) -> list[int]:
    """Processes of `uid` still there after `timeout_s` (a command orphaned by its killed lane
    may take a moment to finish)."""
    deadline = time.monotonic() + timeout_s
    while _processes_of(uid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _processes_of(uid)


def report(level: str, group: str = "all") -> dict:
    """The lane's report for `level` (cached): every attempt but kill_everything, or that one."""
    if (level, group) not in _reports:
        names = ["kill_everything"] if group == "kill_everything" else []
        argv, env, uid = _argv(level, names)
        if group == "kill_everything" and level == "rlimits_user" and uid is None:
            pytest.skip("kill -9 -1 as the caller's uid would end every process of the user, pytest included")
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, cwd="/tmp")
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        if group == "kill_everything" and done.returncode == -9:  # the command killed the lane too
            holder = lines[0]["holder"]
            alive = uid is not None and holder in _processes_of(uid)
            if alive:
                os.kill(holder, 9)  # our own process, left by the killed lane
            outcome = {"contained": alive, "evidence": f"the lane was killed; its holder survived: {alive}"}
            lines.append({"attempts": {"kill_everything": outcome}})
        else:
            assert done.returncode == 0, done.stderr[-3000:]
        if uid is not None:
            assert _gone(uid) == [], f"processes of the lane's uid {uid} outlived it"
            _remove_files_of(uid)
        _reports[(level, group)] = lines[-1]
    return _reports[(level, group)]


# --- the attempts ---------------------------------------------------------------------------
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", list(EXPECTED))
def test_attempt(name, level):
    outcome = report(level, "kill_everything" if name == "kill_everything" else "all")["attempts"][name]
    if "skip" in outcome:
        pytest.skip(outcome["skip"])
    assert "error" not in outcome, outcome
    cell = expected(name, level)
    assert outcome["contained"] is cell.startswith("contained"), f"{cell}; evidence: {outcome['evidence']}"
    if cell.startswith("open"):
        info = report(level)["info"]
        item = cell.split(": ", 1)[1]
        assert item in info["open"], f"{name} gets through under {level}, but the report does not say {item}"


@pytest.mark.parametrize("level", LEVELS)
def test_the_report_and_the_warning_name_exactly_what_the_red_team_opens(level):
    info, warning = report(level)["info"], report(level)["warning"]
    shown_open = {expected(n, level).split(": ", 1)[1] for n in EXPECTED if expected(n, level).startswith("open")}
    assert set(info["open"]) == shown_open  # nothing reported open that no attempt gets through, and the reverse
    assert info["isolation"] == ("namespaces" if level == "namespaces" else "rlimits")
    for item in info["open"]:
        assert f"{item}: " in warning, (item, warning)


def test_the_lane_and_the_table_hold_the_same_attempts():
    assert list(lane_attempts()) == list(EXPECTED)
    assert len(EXPECTED) >= 25


def table_rows() -> list[str]:
    """docs/sandbox.md's red-team table, one row per attempt."""
    rows = [f"| attempt | what it tries | {' | '.join(HEADERS)} |", "|---|---|---|---|---|"]
    for name, what in lane_attempts().items():
        cells = [c.replace("open: ", "**open**: ") for c in EXPECTED[name]]
        rows.append(f"| `{name}` | {what} | {' | '.join(cells)} |")
    return rows


def test_the_docs_table_is_this_table():
    docs = (ROOT / "docs" / "sandbox.md").read_text()
    missing = [row for row in table_rows() if row not in docs.splitlines()]
    assert not missing, "docs/sandbox.md's red-team table differs; rows expected:\n" + "\n".join(missing)


# --- the trusted side on its own ------------------------------------------------------------
def test_a_hard_link_is_never_written_through_or_read_even_where_the_kernel_allows_it(tmp_path):
    """protected_hardlinks=0 lets a command link a host file it cannot read; the link is made
    here from our side, as such a kernel would let the command make it."""
    host_file = tmp_path / "host.txt"
    host_file.write_text("original")
    host_file.chmod(0o600)
    with Sandbox({"wall_s": 5}, root_dir=str(tmp_path)) as box:
        os.link(host_file, os.path.join(box.workspace, "solution.py"))
        os.link(host_file, os.path.join(box.workspace, "leak.txt"))
        assert box.read_file("leak.txt") is None
        box.write_file("solution.py", "def add(a, b):\n    return a + b\n")
        assert box.read_file("solution.py") == "def add(a, b):\n    return a + b\n"
    assert host_file.read_text() == "original"
    assert (host_file.stat().st_uid, host_file.stat().st_mode & 0o777) == (os.geteuid(), 0o600)


def test_the_code_env_neither_follows_nor_crashes_on_planted_links(tmp_path):
    import envs  # noqa: F401  registers the built-ins
    from envs.code_sandbox import CodeSandboxEnv

    secret = tmp_path / "secret.txt"
    secret.write_text("roll-secret-env")
    secret.chmod(0o600)
    target = tmp_path / "config.txt"
    target.write_text("original")
    env = CodeSandboxEnv(tasks=["add"])
    env.reset(seed=0)
    obs, *_ = env.step(f"<bash>ln -sf {secret} solution.py; ln -sf {target} notes.txt; echo planted</bash>")
    assert "planted" in obs
    assert env.scripted_action().startswith("<write>")  # solution.py reads as absent, not as the secret
    obs, reward, terminated, _, info = env.step("<answer>submit</answer>")
    assert terminated and reward == 0.0 and "roll-secret-env" not in obs
    env.reset(seed=0)
    env.step(f"<bash>ln -sf {target} solution.py</bash>")
    env.step(f"<write>{env.task.solution}</write>")
    _, reward, *_ = env.step("<answer>submit</answer>")
    assert reward == 1.0 and target.read_text() == "original"
    env.close()
