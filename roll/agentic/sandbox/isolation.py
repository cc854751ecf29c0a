"""Which isolation a sandbox can have on this machine, and what each one guarantees.

- "namespaces" (root, `unshare` from util-linux): fresh mount, network, pid, ipc and uts
  namespaces; every mount read-only but the workspace; no network at all (not even loopback);
  the command runs as a dedicated unprivileged uid under rlimits; the pid namespace dies with the
  launcher, so nothing survives the command.
- "rlimits" (anywhere): rlimits, a session and process group of its own and a supervising
  launcher. As root the command still runs as a dedicated uid (so it cannot write root's files or
  signal our processes, and RLIMIT_NPROC binds). Without root it runs as the caller: the network
  is open and writes outside the workspace are stopped only by file permissions.
`GUARANTEES[mode][as_root]` is what an episode's info reports; nothing is assumed.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys

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


def guarantees(mode: str) -> dict:
    key = mode if mode == "namespaces" else ("rlimits_root" if is_root() else "rlimits_user")
    return {"isolation": mode, "as_root": is_root(), **GUARANTEES[key]}


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
