"""Which isolation a sandbox can have on this machine, and what each one guarantees.

- "namespaces" (root, `unshare` from util-linux): fresh mount, network, pid, ipc and uts
  namespaces; every mount read-only but the workspace; the host's shared folders (`/tmp`,
  `/var/tmp`, `/dev/shm`, `/run`: other episodes' workspaces, sockets, shared memory) and the
  training code (`code_folders`: the task sets and their hidden tests) covered by empty
  tmpfs; no network at all (not even loopback); the command runs as a dedicated unprivileged uid
  under rlimits; the pid namespace dies with the launcher, so nothing survives the command.
- "rlimits" (anywhere): rlimits, a session and process group of its own and a supervising
  launcher. As root the command still runs as a dedicated uid (so it cannot write root's files or
  signal our processes, and RLIMIT_NPROC binds). Without root it runs as the caller: writes
  outside the workspace are stopped only by file permissions.
Under both, where the kernel takes it (`seccomp_available`), a seccomp filter refuses every socket
but a unix one, ptrace and io_uring (launcher.py): then rlimits has no network either.
`GUARANTEES[level]` is what an episode's info reports, `open_items(level)` what it does not contain
(`info()["open"]`, and a warning logged once per process); nothing is assumed. The red team
(tests/agentic/test_sandbox_red_team.py) checks each item both ways.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

UNSHARE_FLAGS = ("--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child", "--mount-proc")
MODES = ("auto", "namespaces", "rlimits")
_ROOT_RLIMITS = {"network_isolated": False, "filesystem": "uid", "pid": "uid", "leftovers": "uid"}
GUARANTEES = {
    "namespaces": {"network_isolated": True, "filesystem": "read_only", "pid": "namespace", "leftovers": "namespace"},
    "rlimits_root": _ROOT_RLIMITS,
    "rlimits_user": {"network_isolated": False, "filesystem": "permissions", "pid": "none", "leftovers": "descendants"},
}
"""What each isolation guarantees: `network_isolated` True when the command has no network; `filesystem`
how writes outside the workspace are stopped (read-only mounts, a uid of its own, or only the
caller's own file permissions); `pid` how our processes are hidden from it; `leftovers` how its
processes are found and killed (the pid namespace, its uid, or the launcher's descendants)."""


LAUNCHER = str(Path(__file__).with_name("launcher.py"))
SHARED_FOLDERS = ("/tmp", "/var/tmp", "/dev/shm", "/run")
"""Host folders that others write in, hidden under namespaces (the workspace is kept)."""


def code_folders() -> list[str]:
    """The training code, hidden under namespaces: the checkout holding the `roll` package (a
    folder with a pyproject.toml or .git), else the installed `roll` and `envs` packages."""
    package = Path(__file__).resolve().parents[2]
    if any((package.parent / marker).exists() for marker in ("pyproject.toml", ".git")):
        return [str(package.parent)]
    envs = importlib.util.find_spec("envs")
    return [str(package), *(envs.submodule_search_locations or [] if envs else [])]


def is_root() -> bool:
    return os.geteuid() == 0


@functools.cache
def namespaces_available() -> str | None:
    """None when `unshare` can make the namespaces here, else why not (probed once per process)."""
    if not is_root():
        return "not root"
    unshare = shutil.which("unshare")
    if unshare is None:
        return "no unshare binary (util-linux)"
    try:
        probe = subprocess.run([unshare, *UNSHARE_FLAGS, "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare failed: {e}"
    if probe.returncode != 0:
        return f"unshare failed: {probe.stderr.decode(errors='replace').strip()[:200]}"
    return None


def choose_mode(requested: str) -> str:
    """The isolation to run: "auto" takes namespaces when available; asking for namespaces where
    they are not is an error naming why."""
    if requested not in MODES:
        raise ValueError(f"sandbox isolation must be one of {MODES}, got {requested!r}")
    why_not = namespaces_available() if requested != "rlimits" else "not asked for"
    if requested == "namespaces" and why_not:
        raise RuntimeError(f"sandbox isolation 'namespaces' is unavailable here: {why_not}")
    return "namespaces" if why_not is None else "rlimits"


_NETWORK = "TCP and UDP on loopback and beyond (the agent proxy's and Ray's ports), where seccomp is unavailable"
_PROCESS_LIST = "every host process's command line (/proc/PID/cmdline), a token passed as an argument included"
OPEN = {
    "namespaces": {
        "host_files": "world-readable host files outside the hidden folders (/etc, /usr, other projects), read-only",
    },
    "rlimits_root": {
        "network": _NETWORK,
        "unix_sockets": "the host's abstract unix sockets, and socket files others may write",
        "process_list": _PROCESS_LIST,
        "host_files": "world-readable host files, the training code and its task sets included",
        "shared_folders": "files in /tmp, /var/tmp and /dev/shm: outside the disk cap, seen by the host until close",
        "sysv_ipc": "the host's SysV IPC objects (shared memory, semaphores, queues) that others may use",
    },
    "rlimits_user": {
        "network": _NETWORK,
        "unix_sockets": "every unix socket of the caller's uid and the host's abstract ones",
        "process_list": _PROCESS_LIST,
        "host_files": "every file the caller may read or write: ~/.ssh, the repository, the training code",
        "shared_folders": "files in /tmp, /var/tmp and /dev/shm: outside the disk cap, left after close",
        "sysv_ipc": "the SysV IPC objects of the caller's uid and those others may use",
        "same_uid_processes": "the environment (/proc/PID/environ) and signals of every process of the caller's "
        "uid: the env worker, the agent proxy, Ray (kill -9 -1 ends them all)",
        "other_workspaces": "other episodes' workspaces (the same uid)",
        "ptrace": "/proc/PID/mem of the caller's processes, and ptrace itself where seccomp is unavailable "
        "(Yama's ptrace_scope is 0 or absent)",
    },
}
"""What each isolation level leaves open: item -> what the command can reach. `open_items` drops
what this machine closes anyway: the network where the seccomp filter installs, /proc/PID/mem
under a Yama ptrace_scope >= 1."""


def level(mode: str) -> str:
    """The key of GUARANTEES and OPEN: "namespaces", "rlimits_root" or "rlimits_user"."""
    return mode if mode == "namespaces" else ("rlimits_root" if is_root() else "rlimits_user")


def ptrace_scope() -> int:
    """Yama's ptrace_scope (0 when there is no Yama: same-uid processes may trace each other)."""
    try:
        return int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text())
    except (OSError, ValueError):
        return 0


def open_items(key: str) -> dict[str, str]:
    items = dict(OPEN[key])
    if "ptrace" in items and ptrace_scope() >= 1:
        del items["ptrace"]  # only descendants may be traced: the host's processes are not its own
    if "network" in items and seccomp_available() is None:
        del items["network"]  # the filter refuses every socket but a unix one
    return items


@functools.cache
def seccomp_available() -> str | None:
    """None when the launcher's seccomp filter installs here and refuses a TCP socket, else why
    not (probed once per process, in a process of its own)."""
    try:
        probe = subprocess.run(
            [sys.executable, "-I", "-S", LAUNCHER, "--probe-seccomp"], capture_output=True, timeout=30, env={}
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"the probe failed: {e}"
    if probe.returncode != 0 or b"seccomp ok" not in probe.stdout:
        return f"seccomp refused: {probe.stderr.decode(errors='replace').strip()[-200:]}"
    return None


def guarantees(mode: str) -> dict:
    key, seccomp = level(mode), seccomp_available() is None
    return {
        "isolation": mode,
        "as_root": is_root(),
        **GUARANTEES[key],
        "network_isolated": GUARANTEES[key]["network_isolated"] or seccomp,
        "seccomp": seccomp,
        "open": sorted(open_items(key)),
    }


@functools.cache
def warn_open(key: str) -> None:
    """Log, once per process and level, what this isolation does not contain."""
    items = open_items(key)
    if items:
        named = "; ".join(f"{name}: {text}" for name, text in items.items())
        logging.getLogger("roll.agentic.sandbox").warning(
            "sandbox isolation %s does not contain: %s (docs/sandbox.md, red team table)", key, named
        )


def unshare_prefix() -> list[str]:
    return [shutil.which("unshare") or "unshare", *UNSHARE_FLAGS]


def closed_ancestors(paths: list[str]) -> dict[str, list[str]]:
    """For each path, the first ancestor others cannot enter (no o+x) and its child on the way:
    {"/root": ["/root/.pyenv"]} for an interpreter under a 0700 /root. The launcher re-exposes
    them inside a mount namespace. (A second closed folder below the first is not handled.)"""
    closed: dict[str, list[str]] = {}
    for path in paths:
        parts = os.path.realpath(path).split(os.sep)[1:]
        for depth in range(1, len(parts)):
            folder = os.sep + os.path.join(*parts[:depth])
            if not os.stat(folder).st_mode & 0o001:
                child = os.path.join(folder, parts[depth])
                if child not in closed.setdefault(folder, []):
                    closed[folder].append(child)
                break
    return closed


def reachable_by_others(path: str) -> bool:
    """Whether a uid that owns nothing can run `path` (every folder on the way o+x, the file o+x)."""
    real = os.path.realpath(path)
    folder = os.path.dirname(real)
    while folder != os.sep:
        if not os.stat(folder).st_mode & 0o001:
            return False
        folder = os.path.dirname(folder)
    return bool(os.stat(real).st_mode & 0o001)


def interpreter_paths() -> list[str]:
    """Folders the sandboxed Python needs to read: its executable's folder and its prefixes."""
    return sorted({os.path.dirname(os.path.realpath(sys.executable)), sys.prefix, sys.base_prefix})
