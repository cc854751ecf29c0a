"""The process between the sandbox and the command it runs (stdlib only; run as a script).

`python -I -S launcher.py SPEC_JSON` is started by `roll.agentic.sandbox.sandbox.Sandbox`, under
`unshare` (isolation "namespaces") or directly (isolation "rlimits"), always in a session of its
own. It:
1. with namespaces (as root, in fresh mount, network, pid, ipc and uts namespaces): re-exposes
   interpreter folders that sit under a folder the sandbox user cannot enter (`/root/.pyenv`
   under a 0700 `/root`), covers the folders to hide (the host's `/tmp`, `/dev/shm`, ..., the
   training code) with empty tmpfs, keeping the workspace and the interpreter, binds the
   workspace onto itself and makes every other mount read-only;
2. becomes a child subreaper, forks the command, and in the child sets the rlimits (CPU seconds,
   address space, processes, file size, no core files), drops to the sandbox uid when given one,
   installs the seccomp filter when asked (`seccomp_filter`: no socket but AF_UNIX, no ptrace,
   no io_uring; with no_new_privs, so no setuid binary gains anything), and execs it in the
   workspace with a scrubbed environment;
3. waits for the command (killing it a moment after `wall_s` should the caller be gone), then
   kills every process left under it (orphans come back to it),
   and writes one JSON status line to the status fd: exit code or signal, CPU seconds, processes left over.
A launcher killed before it writes its status is itself a finding (the command killed its parent).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import resource
import signal
import socket
import sys
import time

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE, MS_MOVE = (
    1,
    2,
    4,
    32,
    4096,
    16384,
    1 << 18,
    8192,
)
_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_CHILD_SUBREAPER = 36


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = [None if s is None else s.encode() for s in (source, target, fstype, data)]
    if _libc.mount(enc[0], enc[1], enc[2], flags, enc[3]) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def _mount_points() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4].encode().decode("unicode_escape") for line in f]
    return sorted(set(points), key=len)


def _expose(closed: str, inside: list[str], stage: str) -> None:
    """Make `inside` (folders under the untraversable `closed`) reachable: bind them aside, cover
    `closed` with a world-traversable tmpfs, and move them back under it."""
    staged = []
    for n, path in enumerate(inside):
        spot = os.path.join(stage, str(n))
        os.makedirs(spot, exist_ok=True)
        _mount(path, spot, None, MS_BIND | MS_REC)
        staged.append((spot, path))
    _mount("tmpfs", closed, "tmpfs", 0, "mode=0755,size=64k")
    for spot, path in staged:
        os.makedirs(path, exist_ok=True)
        _mount(spot, path, None, MS_MOVE)


def _hide(folders: list[str], keep: list[str]) -> None:
    """Cover each of `folders` with an empty tmpfs, keeping the paths of `keep` below it: each is
    held by an fd taken before the cover and bound back from it (/proc/self/fd/N)."""
    for folder in sorted(folders, key=len):
        if folder in keep or os.path.islink(folder) or not os.path.isdir(folder):
            continue
        inside = [k for k in sorted(keep, key=len) if k.startswith(folder + "/") and os.path.exists(k)]
        inside = [k for k in inside if not any(k.startswith(other + "/") for other in inside)]
        held = [(os.open(path, os.O_PATH | os.O_CLOEXEC), path) for path in inside]
        _mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k")
        for fd, path in held:
            if os.path.isdir(f"/proc/self/fd/{fd}"):
                os.makedirs(path, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                open(path, "a").close()
            _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
            os.close(fd)


def _lock_filesystem(spec: dict) -> None:
    """Namespaces only: everything read-only except the workspace (this mount namespace's copy),
    the folders to hide covered."""
    workspace = spec["workspace"]
    _mount("none", "/", None, MS_REC | MS_PRIVATE)
    for closed, inside in spec.get("expose", {}).items():
        _expose(closed, inside, spec["stage"])
    _hide(spec.get("hide", []), [workspace, *spec.get("keep", [])])
    _mount(workspace, workspace, None, MS_BIND | MS_REC)
    for point in _mount_points():
        if point == workspace or point == "/proc" or point.startswith("/proc/"):
            continue
        try:
            _mount("none", point, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
        except OSError:
            pass  # a mount the kernel will not remount (e.g. a locked one) stays as it was
    # /proc stays: it is this pid namespace's own, showing only the sandbox's processes.


def _limit(spec: dict) -> None:
    """In the command's child: rlimits, the sandbox uid, the workspace."""
    lim = spec["limits"]
    cpu = int(lim["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    mem = int(lim["memory_mb"]) << 20
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    fsize = int(lim["file_size_mb"]) << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    nproc = int(spec["nproc"])
    uid = spec.get("uid")
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        os.setuid(uid)
    else:
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    os.chdir(spec["workspace"])
    if spec.get("seccomp"):
        install_seccomp()  # last: it refuses nothing the steps above need


# seccomp: the syscall numbers it filters, per architecture (AUDIT_ARCH_*, then the numbers)
_SYSCALLS = {
    "x86_64": (0xC000003E, {"socket": 41, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311}),
    "aarch64": (0xC00000B7, {"socket": 198, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271}),
}
_IO_URING = (425, 426, 427)  # io_uring_setup/enter/register, the same on both: its ops bypass seccomp
_LD, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2


class _Instruction(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Instruction))]


def seccomp_program() -> list[tuple[int, int, int, int]] | None:
    """The filter as (code, jt, jf, k) rows, or None on an architecture we have no numbers for.
    socket() of any family but AF_UNIX fails with EAFNOSUPPORT (no TCP, UDP, netlink, vsock,
    raw); ptrace and process_vm_readv/writev with EPERM; io_uring with ENOSYS; a foreign ABI
    (x86's int 0x80, x32) with ENOSYS. Everything else is allowed."""
    if platform.machine() not in _SYSCALLS:
        return None
    arch, nr = _SYSCALLS[platform.machine()]
    denied = [nr["ptrace"], nr["process_vm_readv"], nr["process_vm_writev"]]
    rows = [
        (_LD, 0, 0, 4),  # the architecture
        (_JEQ, 1, 0, arch),
        (_RET, 0, 0, _ERRNO | errno.ENOSYS),
        (_LD, 0, 0, 0),  # the syscall number
        (_JGE, 0, 1, 0x40000000),  # x32 numbers on x86_64
        (_RET, 0, 0, _ERRNO | errno.ENOSYS),
        (_JEQ, 0, 4, nr["socket"]),
        (_LD, 0, 0, 16),  # socket's first argument (the low word: little-endian), the family
        (_JEQ, 0, 1, int(socket.AF_UNIX)),
        (_RET, 0, 0, _ALLOW),
        (_RET, 0, 0, _ERRNO | errno.EAFNOSUPPORT),
    ]
    for n, number in enumerate(denied):  # each jumps to the EPERM row after the io_uring rows
        rows.append((_JEQ, len(denied) - n - 1 + len(_IO_URING) + 1, 0, number))
    for n, number in enumerate(_IO_URING):
        rows.append((_JEQ, len(_IO_URING) - n - 1 + 2, 0, number))
    rows += [(_RET, 0, 0, _ALLOW), (_RET, 0, 0, _ERRNO | errno.EPERM), (_RET, 0, 0, _ERRNO | errno.ENOSYS)]
    return rows


def install_seccomp() -> None:
    """no_new_privs, then the filter (raises OSError where the kernel refuses it)."""
    rows = seccomp_program()
    if rows is None:
        raise OSError(errno.ENOSYS, f"no seccomp syscall table for {platform.machine()}")
    program = (_Instruction * len(rows))(*[_Instruction(*row) for row in rows])
    fprog = _Program(len(rows), program)
    for args in (
        (PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0),
        (PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0),
    ):
        if _libc.prctl(*[ctypes.c_ulong(a) for a in args]) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"prctl({args[0]}): {os.strerror(err)}")


def probe_seccomp() -> None:
    """`launcher.py --probe-seccomp`: install the filter, show it refuses TCP and keeps unix sockets."""
    install_seccomp()
    try:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    except OSError as e:
        if e.errno != errno.EAFNOSUPPORT:
            raise
    else:
        raise SystemExit("the filter let a TCP socket through")
    for end in socket.socketpair(socket.AF_UNIX):  # unix sockets still work
        end.close()
    print("seccomp ok")


def _descendants(root: int) -> list[int]:
    """Pids whose parent chain reaches `root` (from /proc; the subreaper keeps orphans here)."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [], [root]
    while frontier:
        kids = [pid for pid, ppid in parent.items() if ppid in frontier]
        found += kids
        frontier = kids
    return found


def _kill_leftovers() -> int:
    """SIGKILL every process under the launcher until none is left; how many there were."""
    seen: set[int] = set()
    for _ in range(50):
        pids = _descendants(os.getpid())
        if not pids:
            break
        seen.update(pids)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        while True:  # reap what died
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        time.sleep(0.01)
    return len(seen)


def main() -> None:
    if sys.argv[1] == "--probe-seccomp":
        return probe_seccomp()
    spec = json.loads(sys.argv[1])
    status_fd = int(spec["status_fd"])
    if spec["mode"] == "namespaces":
        _lock_filesystem(spec)
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    pid = os.fork()
    if pid == 0:
        try:
            os.close(status_fd)
            _limit(spec)
            os.execve(spec["argv"][0], spec["argv"], spec["env"])
        except BaseException as e:  # noqa: BLE001 - the child must never return into the launcher
            os.write(2, f"sandbox: cannot start the command: {e}\n".encode())
        os._exit(127)
    # the caller enforces wall_s; this alarm (a second later) ends the command even if the caller
    # was killed and nobody is left to enforce it
    signal.signal(signal.SIGALRM, lambda *_: os.kill(pid, signal.SIGKILL))
    signal.alarm(int(float(spec["limits"]["wall_s"])) + 2)
    _, status, usage = os.wait4(pid, 0)
    signal.alarm(0)
    leftover = _kill_leftovers()
    child_cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    report = {
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "cpu_s": round(child_cpu.ru_utime + child_cpu.ru_stime, 3),
        "max_rss_kb": usage.ru_maxrss,
        "leftover_processes": leftover,
    }
    os.write(status_fd, (json.dumps(report) + "\n").encode())


if __name__ == "__main__":
    main()
