"""Red-team attempts against `roll.agentic.sandbox.Sandbox`, beyond the ten of sandbox_escapes.py.

`python sandbox_red_team.py MODE [ATTEMPT ...]` runs the attempts (all but `kill_everything`
unless named) under isolation MODE and prints one JSON line: {"info": a sandbox's info(),
"warning": what the sandbox logged at start, "attempts": {name: {"contained": bool, "evidence":
str} or {"skip": why}}}. tests/agentic/test_sandbox_red_team.py runs it under each isolation,
as a uid of its own for rlimits without root, and holds what each level must give.

Each attempt sets up what a training host holds (a process with the agent proxy's per-episode
token in its environment and on its command line, as an agent or a Ray worker would; loopback
listeners; another episode's workspace; private files), runs commands in a fresh sandbox, and
judges from the host whether the command got what it went for. Stdlib only, besides the sandbox
and the code_sandbox grader (loaded by its path), so that the system python3 runs it as another
uid.
"""

from __future__ import annotations

import ctypes
import http.server
import importlib.util
import io
import json
import logging
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from roll.agentic.sandbox import Sandbox

ROOT = Path(__file__).resolve().parents[2]
LIMITS = {"wall_s": 5.0, "cpu_s": 2, "max_procs": 16, "memory_mb": 256, "output_bytes": 65536}
ADD = ("assert solution.add(1, 2) == 3", "assert solution.add(-5, 5) == 0", "assert solution.add(2, 2) == 4")
STARTER = "def add(a, b):\n    raise NotImplementedError\n"
ATTEMPTS: dict[str, tuple[str, object]] = {}  # name -> (what it tries, function)


def _grader():
    spec = importlib.util.spec_from_file_location("red_team_grader", ROOT / "envs" / "code_sandbox" / "grader.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def attempt(what: str):
    def register(fn):
        ATTEMPTS[fn.__name__] = (what, fn)
        return fn

    return register


def verdict(contained: bool, evidence: str) -> dict:
    return {"contained": bool(contained), "evidence": evidence[-600:]}


class Host:
    """What the training host holds during one attempt; everything it made goes at `close`."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.secret = f"roll-secret-{secrets.token_hex(8)}"
        self.private = tempfile.mkdtemp(prefix="roll-rt-private-")  # 0700: only the caller enters
        self.exposed = tempfile.mkdtemp(prefix="roll-rt-exposed-")  # 0755: others may pass, not read
        os.chmod(self.exposed, 0o755)
        self.boxes: list[Sandbox] = []
        self.procs: list[subprocess.Popen] = []
        self.closers: list = []

    def box(self, **limits) -> Sandbox:
        box = Sandbox({**LIMITS, **limits}, isolation_mode=self.mode)
        self.boxes.append(box)
        return box

    def file(self, folder: str, name: str, text: str, mode: int) -> str:
        path = os.path.join(folder, name)
        Path(path).write_text(text)
        os.chmod(path, mode)
        return path

    def holder(self) -> subprocess.Popen:
        """A process of the caller's uid with the token in its environment and command line, and
        a private working folder (as an agent talking to the proxy, or a Ray worker)."""
        env = {"PATH": "/usr/bin:/bin", "OPENAI_API_KEY": self.secret, "ROLL_PROXY_TOKEN": self.secret}
        code = "import sys, time; print('up', flush=True); time.sleep(120)"
        proc = subprocess.Popen(
            [sys.executable, "-c", code, f"--token={self.secret}"],
            env=env,
            cwd=self.private,
            stdout=subprocess.PIPE,
        )
        proc.stdout.readline()  # up: its environment and command line are in place
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for closer in self.closers:
            closer()
        for proc in self.procs:
            proc.kill()
            proc.wait()
        for box in self.boxes:
            box.close()
        shutil.rmtree(self.private, ignore_errors=True)
        shutil.rmtree(self.exposed, ignore_errors=True)


def _alive(proc: subprocess.Popen) -> bool:
    return proc.poll() is None


def _with_nonce(nonce: str) -> list[int]:
    """Live processes whose environment carries RT_NONCE=nonce (as far as we may read)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if f"RT_NONCE={nonce}".encode() in environ.split(b"\0") and state != "Z":
            found.append(int(entry))
    return found


def _reap_nonce(host: Host, nonce: str) -> None:
    """Should an attempt's processes outlive the sandbox, end them with the host (by their nonce)."""

    def kill() -> None:
        for pid in _with_nonce(nonce):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    host.closers.append(kill)


def _accepted(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        sock.accept()[0].close()
        return True
    except BlockingIOError:
        return False


def _tcp_listener(host: Host, family=socket.AF_INET, address="127.0.0.1") -> socket.socket:
    sock = socket.socket(family)
    sock.bind((address, 0))
    sock.listen(8)
    host.closers.append(sock.close)
    return sock


_SCAN_PROC = """
import os, sys
for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
        data = open(f'/proc/{pid}/' + sys.argv[1], 'rb').read()
    except OSError:
        continue
    for part in data.split(b'\\0'):
        if b'roll-secret-' in part:
            print(pid, part.decode(errors='replace'))
"""


# --- secrets of the host's processes --------------------------------------------------------
@attempt("the proxy token and Ray's in the caller's environment, read from the command's own")
def token_in_env(host: Host) -> dict:
    names = ("OPENAI_API_KEY", "ROLL_PROXY_TOKEN", "RAY_ADDRESS")
    old = {name: os.environ.get(name) for name in names}
    os.environ.update({name: host.secret for name in names})
    try:
        out = host.box().run_shell("env; tr '\\0' '\\n' < /proc/self/environ").output
    finally:
        for name, value in old.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value
    return verdict(host.secret not in out, out)


@attempt("the caller's environment (the token) read from the launcher: /proc/$PPID/environ")
def launcher_environ(host: Host) -> dict:
    os.environ["ROLL_PROXY_TOKEN"] = host.secret
    try:
        out = host.box().run_shell("tr '\\0' '\\n' < /proc/$PPID/environ; echo ppid=$PPID").output
    finally:
        del os.environ["ROLL_PROXY_TOKEN"]
    return verdict(host.secret not in out, out)


@attempt("a host process's token in /proc/PID/environ (an agent, the proxy, a Ray worker)")
def proc_environ(host: Host) -> dict:
    holder = host.holder()
    box = host.box()
    out = box.run([box.python, "-c", _SCAN_PROC, "environ"]).output
    return verdict(host.secret not in out, f"holder {holder.pid}: {out}")


@attempt("a token passed on a host process's command line: /proc/PID/cmdline")
def proc_cmdline(host: Host) -> dict:
    holder = host.holder()
    box = host.box()
    out = box.run([box.python, "-c", _SCAN_PROC, "cmdline"]).output
    return verdict(host.secret not in out, f"holder {holder.pid}: {out}")


@attempt("files in a host process's private working folder through /proc/PID/cwd")
def proc_cwd(host: Host) -> dict:
    host.file(host.private, "notes.txt", host.secret, 0o600)
    holder = host.holder()
    out = (
        host.box()
        .run_shell(f"cat /proc/{holder.pid}/cwd/notes.txt /proc/{holder.pid}/root{host.private}/notes.txt")
        .output
    )
    return verdict(host.secret not in out, out)


@attempt("PTRACE_ATTACH to a host process of the caller's uid, and reading its memory (/proc/PID/mem)")
def ptrace_host(host: Host) -> dict:
    holder = host.holder()
    code = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"rc = libc.ptrace(16, {holder.pid}, None, None)\n"
        "print('attached' if rc == 0 else 'ptrace refused: ' + os.strerror(ctypes.get_errno()))\n"
        f"rc == 0 and libc.ptrace(17, {holder.pid}, None, None)\n"
        "try:\n"
        f"    start = int(open('/proc/{holder.pid}/maps').readline().split('-')[0], 16)\n"
        f"    with open('/proc/{holder.pid}/mem', 'rb') as mem:\n"
        "        mem.seek(start)\n        print('read memory', len(mem.read(64)))\n"
        "except (OSError, ValueError) as e:\n    print('mem refused:', e)\n"
    )
    box = host.box()
    out = box.run([box.python, "-c", code]).output
    return verdict("attached" not in out and "read memory" not in out and _alive(holder), out)


@attempt("SIGKILL to a host process of the caller's uid")
def signal_host(host: Host) -> dict:
    holder = host.holder()
    out = host.box().run_shell(f"kill -9 {holder.pid}; echo rc=$?").output
    time.sleep(0.2)
    return verdict(_alive(holder), f"holder alive: {_alive(holder)}; {out}")


@attempt("kill -9 -1: every process the command may signal")
def kill_everything(host: Host) -> dict:
    holder = host.holder()
    print(json.dumps({"holder": holder.pid}), flush=True)  # the caller may not live to report
    out = host.box().run_shell("kill -9 -1; echo rc=$?").output
    time.sleep(0.2)
    return verdict(_alive(holder), f"holder alive: {_alive(holder)}; {out}")


# --- other episodes, host files -------------------------------------------------------------
@attempt("another episode's workspace read (its solution)")
def other_workspace_read(host: Host) -> dict:
    other = host.box()
    other.write_file("solution.py", host.secret)
    pattern = os.path.join(tempfile.gettempdir(), "roll-sandbox-*")
    out = host.box().run_shell(f"ls -d {pattern}; cat {pattern}/ws/solution.py").output
    return verdict(host.secret not in out, out)


@attempt("another episode's workspace written (its solution replaced)")
def other_workspace_write(host: Host) -> dict:
    other = host.box()
    other.write_file("solution.py", host.secret)
    pattern = os.path.join(tempfile.gettempdir(), "roll-sandbox-*")
    out = host.box().run_shell(f"for f in {pattern}/ws/solution.py; do echo pwned > $f; done").output
    return verdict(other.read_file("solution.py") == host.secret, out)


@attempt("the caller's SSH key (~/.ssh in a 0700 home)")
def read_ssh_key(host: Host) -> dict:
    home = os.path.join(host.private, "home")
    os.makedirs(os.path.join(home, ".ssh"), mode=0o700)
    key = host.file(os.path.join(home, ".ssh"), "id_ed25519", host.secret, 0o600)
    out = host.box().run_shell(f"cat {key}; ls -a ~ /root 2>&1 | head -20").output
    return verdict(host.secret not in out, out)


@attempt("the training code: the code_sandbox task set with its hidden tests and answers")
def read_training_code(host: Host) -> dict:
    tasks = ROOT / "envs" / "code_sandbox" / "tasks.py"
    out = host.box().run_shell(f"cat {tasks}; ls {ROOT}").output
    return verdict("assert solution.add" not in out, out[:300])


@attempt("a world-readable host file (/etc/passwd)")
def read_host_file(host: Host) -> dict:
    out = host.box().run_shell("cat /etc/passwd").output
    return verdict("root:" not in out, out[:200])


@attempt("a private file in the host's /dev/shm (a shared-memory segment of the caller)")
def dev_shm_private(host: Host) -> dict:
    path = host.file("/dev/shm", f"roll-rt-{secrets.token_hex(4)}", host.secret, 0o600)
    host.closers.append(lambda: os.path.exists(path) and os.unlink(path))
    out = host.box().run_shell(f"cat {path}").output
    return verdict(host.secret not in out, out)


@attempt("a file left in the host's /tmp for host processes to find")
def shared_tmp_write(host: Host) -> dict:
    path = os.path.join(tempfile.gettempdir(), f"roll-rt-planted-{secrets.token_hex(4)}")
    host.closers.append(lambda: os.path.exists(path) and os.unlink(path))
    box = host.box()
    out = box.run_shell(f"echo planted > {path}; ls -l {path}").output
    planted = os.path.exists(path)
    box.close()
    return verdict(not planted, f"there after the command: {planted}; after close: {os.path.exists(path)}; {out}")


# --- links the trusted side might follow ------------------------------------------------------
@attempt("solution.py as a symlink to a host secret, read by the env / grader side")
def symlink_read(host: Host) -> dict:
    secret = host.file(host.private, "secret.txt", host.secret, 0o600)
    box = host.box()
    box.run_shell(f"ln -sf {secret} solution.py; ln -s {host.private} d")
    try:
        seen = [box.read_file("solution.py"), box.read_file("d/secret.txt")]
    except Exception as e:  # noqa: BLE001 - a crash of the trusted side is a finding too
        return verdict(False, f"the trusted side raised {e!r}")
    return verdict(not any(s and host.secret in s for s in seen), f"read back: {seen}")


@attempt("solution.py as a symlink to a host file, then written by the env")
def symlink_write(host: Host) -> dict:
    target = host.file(host.private, "config.txt", "original", 0o644)
    box = host.box()
    box.run_shell(f"ln -sf {target} solution.py")
    try:
        box.write_file("solution.py", STARTER)
    except Exception as e:  # noqa: BLE001
        return verdict(False, f"the trusted side raised {e!r}")
    kept = Path(target).read_text() == "original"
    return verdict(kept and box.read_file("solution.py") == STARTER, f"host file kept: {kept}")


@attempt("a folder symlink to a host folder, then a file written below it by the env")
def symlink_dir_write(host: Host) -> dict:
    box = host.box()
    box.run_shell(f"ln -s {host.private} pkg")
    try:
        box.write_file("pkg/helper.py", "X = 1\n")
    except Exception as e:  # noqa: BLE001
        return verdict(False, f"the trusted side raised {e!r}")
    landed = os.path.exists(os.path.join(host.private, "helper.py"))
    return verdict(not landed and box.read_file("pkg/helper.py") == "X = 1\n", f"landed in the host folder: {landed}")


@attempt("solution.py as a hard link to a host file, then written (and chowned) by the env")
def hardlink_write(host: Host) -> dict:
    target = host.file(host.exposed, "config.txt", "original", 0o644)
    before = os.stat(target)
    box = host.box()
    out = box.run_shell(f"ln -f {target} solution.py && echo linked").output
    try:
        box.write_file("solution.py", STARTER)
    except Exception as e:  # noqa: BLE001
        return verdict(False, f"the trusted side raised {e!r}")
    after = os.stat(target)
    kept = Path(target).read_text() == "original" and (after.st_uid, after.st_mode) == (before.st_uid, before.st_mode)
    return verdict(kept, f"host file kept: {kept}; {out}")


@attempt("a hard link to a host secret the command cannot read, read by the env")
def hardlink_read(host: Host) -> dict:
    secret = host.file(host.exposed, "secret.txt", host.secret, 0o600)
    box = host.box()
    out = box.run_shell(f"ln -f {secret} leak.txt && echo linked; cat leak.txt").output
    try:
        seen = box.read_file("leak.txt")
    except Exception as e:  # noqa: BLE001
        return verdict(False, f"the trusted side raised {e!r}")
    return verdict(not (seen and host.secret in seen), f"read back: {seen!r}; {out}")


def _within(seconds: float, fn) -> tuple[bool, object]:
    """(finished, what fn returned) with fn run in a thread given `seconds`."""
    done: list = []
    worker = threading.Thread(target=lambda: done.append(fn()), daemon=True)
    worker.start()
    worker.join(seconds)
    return (not worker.is_alive() and bool(done)), (done[0] if done else None)


@attempt("solution.py as a fifo, to hang the env when it reads or writes it")
def fifo_trap(host: Host) -> dict:
    box = host.box()
    box.run_shell("rm -f solution.py; mkfifo solution.py")
    read, seen = _within(5, lambda: box.read_file("solution.py"))
    if not read:
        return verdict(False, "read_file hung on the fifo")
    wrote, _ = _within(5, lambda: box.write_file("solution.py", STARTER))
    if not wrote:
        return verdict(False, "write_file hung on the fifo")
    return verdict(seen is None and box.read_file("solution.py") == STARTER, f"read back: {seen!r}")


@attempt("chmod 000 on folders of the workspace, to lock the env out and survive cleanup")
def chmod_lockout(host: Host) -> dict:
    box = host.box()
    box.run_shell("mkdir -p keep/deep && echo x > keep/deep/f && chmod 000 keep/deep keep && chmod 500 .")
    try:
        box.write_file("solution.py", STARTER)
        readable = box.read_file("solution.py") == STARTER
    except Exception as e:  # noqa: BLE001
        return verdict(False, f"the trusted side raised {e!r}")
    workspace = box.workspace
    box.close()
    return verdict(
        readable and not os.path.exists(workspace), f"written: {readable}; left: {os.path.exists(workspace)}"
    )


# --- the network and local sockets ------------------------------------------------------------
@attempt("an HTTP request to the agent proxy's loopback port")
def loopback_proxy(host: Host) -> dict:
    requests: list[str] = []

    class Proxy(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            requests.append(self.path)
            self.send_response(401)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host.closers += [server.shutdown, server.server_close]
    url = f"http://127.0.0.1:{server.server_port}/v1/chat/completions"
    code = (
        "import urllib.request\n"
        f"req = urllib.request.Request({url!r}, data=b'{{}}', headers={{'Authorization': 'Bearer guess'}})\n"
        "try:\n    urllib.request.urlopen(req, timeout=2)\nexcept Exception as e:\n    print(repr(e))\n"
    )
    box = host.box()
    out = box.run([box.python, "-c", code]).output
    return verdict(not requests, f"requests served: {requests}; {out}")


@attempt("a scan of loopback ports around Ray's (a TCP listener of the host)")
def loopback_port_scan(host: Host) -> dict:
    ray = _tcp_listener(host)
    port = ray.getsockname()[1]
    code = (
        "import socket\nfound = []\n"
        f"for port in range({max(port - 5, 1)}, {port + 6}):\n"
        "    s = socket.socket()\n    s.settimeout(0.3)\n"
        "    if s.connect_ex(('127.0.0.1', port)) == 0:\n        found.append(port)\n    s.close()\n"
        "print('open ports', found)\n"
    )
    box = host.box()
    out = box.run([box.python, "-c", code]).output
    return verdict(not _accepted(ray) and str(port) not in out, out)


@attempt("a UDP datagram to a host port on loopback (exfiltration)")
def udp_exfil(host: Host) -> dict:
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    host.closers.append(sink.close)
    port = sink.getsockname()[1]
    code = "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    code += f"s.sendto(b'exfil', ('127.0.0.1', {port}))\n"
    box = host.box()
    out = box.run([box.python, "-c", code]).output
    sink.setblocking(False)
    try:
        got = sink.recv(64)
    except BlockingIOError:
        got = b""
    return verdict(got != b"exfil", f"received {got!r}; {out}")


@attempt("a TCP connection to a host listener on IPv6 loopback (::1)")
def ipv6_loopback(host: Host) -> dict:
    try:
        listener = _tcp_listener(host, socket.AF_INET6, "::1")
    except OSError as e:
        return {"skip": f"no IPv6 loopback on this host: {e}"}
    port = listener.getsockname()[1]
    code = f"import socket\ns = socket.socket(socket.AF_INET6)\ns.settimeout(2)\ns.connect(('::1', {port}))\n"
    box = host.box()
    out = box.run([box.python, "-c", code]).output
    return verdict(not _accepted(listener), out)


def _unix_listener(host: Host, path: str | bytes) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(path)
    sock.listen(8)
    host.closers.append(sock.close)
    return sock


_UNIX_CONNECT = "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.connect({!r})\nprint('connected')\n"


@attempt("a world-writable unix socket file of the host (like X11's, in /tmp)")
def unix_socket_shared(host: Host) -> dict:
    folder = tempfile.mkdtemp(prefix="roll-rt-sockets-")
    os.chmod(folder, 0o755)
    host.closers.append(lambda: shutil.rmtree(folder, ignore_errors=True))
    path = os.path.join(folder, "display")
    sock = _unix_listener(host, path)
    os.chmod(path, 0o777)
    box = host.box()
    out = box.run([box.python, "-c", _UNIX_CONNECT.format(path)]).output
    return verdict(not _accepted(sock), out)


@attempt("a unix socket file of the caller made with its umask (like Ray's raylet socket)")
def unix_socket_private(host: Host) -> dict:
    folder = tempfile.mkdtemp(prefix="roll-rt-ray-")
    os.chmod(folder, 0o755)
    host.closers.append(lambda: shutil.rmtree(folder, ignore_errors=True))
    path = os.path.join(folder, "raylet")
    old = os.umask(0o022)
    try:
        sock = _unix_listener(host, path)
    finally:
        os.umask(old)
    box = host.box()
    out = box.run([box.python, "-c", _UNIX_CONNECT.format(path)]).output
    return verdict(not _accepted(sock), out)


@attempt("an abstract unix socket of the host (no file, no permissions)")
def abstract_unix(host: Host) -> dict:
    name = f"\0roll-rt-{secrets.token_hex(4)}"
    sock = _unix_listener(host, name)
    box = host.box()
    out = box.run([box.python, "-c", _UNIX_CONNECT.format(name)]).output
    return verdict(not _accepted(sock), out)


@attempt("a SysV shared-memory segment of the host that others may attach (mode 0666)")
def sysv_shm(host: Host) -> dict:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    key = int.from_bytes(secrets.token_bytes(3), "big") + 1
    shmid = libc.shmget(key, 4096, 0o1000 | 0o666)  # IPC_CREAT
    if shmid < 0:
        return {"skip": f"no SysV shared memory here: {os.strerror(ctypes.get_errno())}"}
    host.closers.append(lambda: libc.shmctl(shmid, 0, None))  # IPC_RMID
    addr = libc.shmat(shmid, None, 0)
    ctypes.memmove(addr, host.secret.encode(), len(host.secret))
    libc.shmdt(ctypes.c_void_p(addr))
    code = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.shmat.restype = ctypes.c_void_p\n"
        f"shmid = libc.shmget({key}, 0, 0)\n"
        "if shmid < 0:\n    print('shmget:', os.strerror(ctypes.get_errno()))\n"
        "else:\n    addr = libc.shmat(shmid, None, 0o10000)\n"  # SHM_RDONLY
        "    print(ctypes.string_at(addr, 40) if addr not in (None, ctypes.c_void_p(-1).value) else 'shmat refused')\n"
    )
    box = host.box()
    out = box.run([box.python, "-c", code]).output
    return verdict(host.secret not in out, out)


# --- processes that try to stay -------------------------------------------------------------
@attempt("a double-forked, setsid, renamed daemon ([kworker/0:1]) that outlives its command")
def double_fork_daemon(host: Host) -> dict:
    nonce = secrets.token_hex(6)
    _reap_nonce(host, nonce)
    code = (
        "import os\n"
        "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        print('daemon', os.getpid(), flush=True)\n"
        "        os.execve('/bin/sleep', ['[kworker/0:1]', '1000'], dict(os.environ))\n"
        "    os._exit(0)\n"
        "os.wait()\nprint('parent done', flush=True)\n"
    )
    box = host.box()
    result = box.run_shell(f"RT_NONCE={nonce} exec {box.python} -c {shlex.quote(code)}")
    left = _with_nonce(nonce)
    return verdict(not left, f"left by nonce: {left}; {result.output.strip()}; leftovers {result.leftover_processes}")


@attempt("a process that re-forks itself forever to outrun the killer (a new pid every step)")
def fork_rabbit(host: Host) -> dict:
    nonce = secrets.token_hex(6)
    _reap_nonce(host, nonce)
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n    os.setsid()\n    while True:\n"
        "        if os.fork():\n            os._exit(0)\n        time.sleep(0.002)\n"
        "print('running', flush=True)\n"
    )
    box = host.box()
    result = box.run_shell(f"RT_NONCE={nonce} exec {box.python} -c {shlex.quote(code)}")
    time.sleep(0.3)
    left = _with_nonce(nonce)
    return verdict(not left, f"left by nonce: {left}; {result.output.strip()}")


@attempt("close stdout and stderr, then run on past the wall-clock limit")
def close_stdout(host: Host) -> dict:
    nonce = secrets.token_hex(6)
    _reap_nonce(host, nonce)
    box = host.box(wall_s=2.0)
    result = box.run_shell(f"exec >&- 2>&-; RT_NONCE={nonce} exec sleep 100")
    left = _with_nonce(nonce)
    return verdict(result.reason == "wall_time" and not left, f"reason {result.reason}, {result.wall_s} s; left {left}")


# --- resources ------------------------------------------------------------------------------
@attempt("fill the disk: 4 MiB files (each under RLIMIT_FSIZE) up to 256 MiB, past a 16 MiB cap")
def disk_fill(host: Host) -> dict:
    box = host.box(disk_mb=16, file_size_mb=4, wall_s=20.0)
    result = box.run_shell("for i in $(seq 64); do head -c 4000000 /dev/zero > f$i || exit 3; done; echo filled")
    written = sum(p.stat().st_size for p in Path(box.workspace).glob("f*")) >> 20
    return verdict(
        result.reason == "disk" and "filled" not in result.output, f"reason {result.reason}; {written} MiB written"
    )


@attempt("fill the disk's inodes: 20,000 empty files past a 4 MiB cap (4 KiB each)")
def inode_fill(host: Host) -> dict:
    box = host.box(disk_mb=4, wall_s=30.0, cpu_s=20)  # a file costs 0.5 ms of CPU on some disks
    code = "for i in range(20000):\n    open(f'e{i}', 'w').close()\nprint('filled')\n"
    result = box.run([box.python, "-c", code])
    made = len(os.listdir(box.workspace))
    return verdict(result.reason == "disk" and "filled" not in result.output, f"reason {result.reason}; {made} entries")


@attempt("invalid UTF-8, NULs and terminal escapes on stdout and stderr")
def invalid_utf8(host: Host) -> dict:
    junk = "\\xff\\xfe\\xc3\\x28 \\xed\\xa0\\x80 \\x00 \\x1b[2J\\x1b]0;pwned\\x07"
    code = f"import sys\nsys.stdout.buffer.write(b'{junk}\\n')\nsys.stdout.flush()\n"
    code += f"sys.stderr.buffer.write(b'{junk}\\n')\n"
    box = host.box()
    try:
        result = box.run([box.python, "-c", code])
        result.output.encode("utf-8")  # a recorder or a tokenizer takes it as is
        json.dumps(result.output)
    except Exception as e:  # noqa: BLE001
        return verdict(False, f"the trusted side raised {e!r}")
    return verdict("\ufffd" in result.output and result.reason == "ok", repr(result.output[:120]))


@attempt("a 64 MiB line without a newline on stderr")
def huge_line(host: Host) -> dict:
    code = "import sys\nsys.stderr.buffer.write(b'x' * (64 << 20))\n"
    box = host.box()
    result = box.run([box.python, "-c", code])
    cap = LIMITS["output_bytes"]
    return verdict(
        result.reason == "output" and len(result.output) <= cap, f"reason {result.reason}, kept {len(result.output)}"
    )


# --- privileges -----------------------------------------------------------------------------
@attempt("become root: setuid(0), setgid(0), su, capabilities")
def setuid_root(host: Host) -> dict:
    code = (
        "import os\nfor f, a in ((os.setuid, 0), (os.setgid, 0), (os.seteuid, 0)):\n"
        "    try:\n        f(a)\n        print('became', f.__name__)\n"
        "    except OSError as e:\n        print(f.__name__, e)\n"
        "print([line for line in open('/proc/self/status') if line.startswith('CapEff')][0].strip())\n"
        "print('uid', os.getuid(), os.geteuid())\n"
    )
    box = host.box()
    out = box.run([box.python, "-c", code]).output
    out += box.run_shell("su -c id root < /dev/null 2>&1 | head -2").output
    became = "became" in out or "uid=0(root)" in out or "CapEff:\t0000000000000000" not in out
    return verdict(not became, out)


@attempt("mount a tmpfs over a host folder, directly and from a new user namespace")
def mount(host: Host) -> dict:
    mark = f"roll-rt-mounted-{secrets.token_hex(4)}"
    box = host.box()
    out = box.run_shell(
        "mkdir -p m; mount -t tmpfs none m && echo mounted-direct; "
        f"unshare -Urm sh -c 'mount -t tmpfs none /etc && touch /etc/{mark} && echo mounted-in-userns' 2>&1"
    ).output
    seen = os.path.exists(f"/etc/{mark}") or any(
        mark in line or box.workspace in line for line in open("/proc/self/mountinfo")
    )
    return verdict(not seen and "mounted-direct" not in out, f"host sees it: {seen}; {out}")


# --- the grader -----------------------------------------------------------------------------
def _graded(host: Host, solution: str, planted: dict[str, str] | None = None) -> tuple[list[bool], Sandbox]:
    box = host.box(wall_s=8.0)
    box.write_file("solution.py", solution)
    for name, text in (planted or {}).items():
        box.write_file(name, text)
    return _grader().grade(box, ADD), box


@attempt("grader spoof: solution.py prints the grader's marker line (read from __main__) and exits")
def grader_spoof_marker(host: Host) -> dict:
    cheat = "import __main__, os\nprint(__main__.MARK + '[true, true, true]', flush=True)\nos._exit(0)\n"
    found, _ = _graded(host, cheat)
    return verdict(found == [False] * 3, f"graded {found}")


@attempt("grader spoof: a value equal to everything (__eq__ always True)")
def grader_spoof_equal(host: Host) -> dict:
    cheat = (
        "class Equal(int):\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return Equal(7)\n"
    )
    found, _ = _graded(host, cheat)
    return verdict(found == [False] * 3, f"graded {found}")


@attempt("grader spoof: a json.py in the workspace shadowing the runner's import")
def grader_spoof_shadow(host: Host) -> dict:
    shadow = "open('shadow_ran', 'w').close()\ndef dumps(x):\n    return '[true, true, true]'\n"
    found, box = _graded(host, STARTER, {"json.py": shadow})
    ran = box.read_file("shadow_ran") is not None
    return verdict(found == [False] * 3 and not ran, f"graded {found}; shadow ran: {ran}")


@attempt("grader spoof: fake result and score files, and a printed verdict")
def grader_spoof_files(host: Host) -> dict:
    box = host.box(wall_s=8.0)
    box.write_file("solution.py", STARTER)
    out = box.run_shell(
        'echo \'{"passed": 3, "score": 1.0}\' > result.json; echo 1.0 > score.txt; '
        "echo '[true, true, true]' > .grade; "
        'echo \'Hidden tests: 3/3 passed.\'; echo \'@@grade-0000000000000000@@["3", "0", "4"]\''
    ).output
    found = _grader().grade(box, ADD)
    return verdict(found == [False] * 3, f"graded {found}; printed {out.strip()!r}")


def main() -> None:
    mode, names = sys.argv[1], sys.argv[2:] or [n for n in ATTEMPTS if n != "kill_everything"]
    logged = io.StringIO()
    logging.getLogger("roll.agentic.sandbox").addHandler(logging.StreamHandler(logged))
    probe = Sandbox(LIMITS, isolation_mode=mode)
    info = probe.info()
    probe.close()
    results = {}
    for name in names:
        host = Host(mode)
        try:
            results[name] = ATTEMPTS[name][1](host)
        except Exception as e:  # noqa: BLE001 - one broken attempt must not hide the others
            results[name] = {"error": repr(e)}
        finally:
            host.close()
    print(json.dumps({"info": info, "warning": logged.getvalue(), "attempts": results}), flush=True)


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    main()
