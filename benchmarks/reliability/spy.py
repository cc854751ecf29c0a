"""Where a running pipeline's processes spend their time: py-spy stacks of the driver and every Ray
worker of one run, sampled for a while, and a summary of them.

`torch.profiler` (`ROLL_PROFILE_CALLS`) sees one synchronous worker call; this sees every process at
once, async actors (the env workers, the inference worker) and the driver included, Python frames
and all, which is what a step that waits on overhead needs. py-spy samples from outside the
process (`--nonblocking`: the process is never paused), so the run's own timings are not disturbed.

    python benchmarks/reliability/spy.py summarize DIR_OR_FILE [--top 30]

prints, for each file that `record` wrote (`<role>-<pid>.txt`, py-spy's raw collapsed stacks) and
each of its threads, the share of the thread's samples in which each function was on the stack
(inclusive) and on top (self). Idle threads are sampled too (`--idle`), so a share is of wall time:
an event loop waiting in `select` shows as such.
`benchmarks/gpu/gpu_e2e.py --spy STEP:SECONDS` calls `record` once its run has logged STEP.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROLES = re.compile(r"ray::(\w+)")


def py_spy() -> str | None:
    """The py-spy executable: on PATH, or in a `bin` folder beside a sys.path entry (`pip install
    --target SITE` puts it in SITE/bin)."""
    found = shutil.which("py-spy")
    if found:
        return found
    for entry in sys.path:
        candidate = Path(entry or ".") / "bin" / "py-spy"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def session_processes(session_id: int) -> list[tuple[int, str]]:
    """(pid, role) of the processes in one process session: the CLI (`driver`) and Ray's workers,
    named by their actor class (`ray::EnvWorker` -> EnvWorker); Ray's own daemons are left out."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            if os.getsid(pid) != session_id:
                continue
            args = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (ProcessLookupError, PermissionError, FileNotFoundError):
            continue
        if pid == session_id:
            found.append((pid, "driver"))
        elif match := ROLES.match(args):
            role = match.group(1)
            if role not in ("IDLE", "DashboardAgent", "RuntimeEnvAgent", "JobSupervisor"):
                found.append((pid, role))
    return sorted(found)


def record(session_id: int, seconds: float, out_dir: Path, rate: int = 100) -> list[subprocess.Popen]:
    """Start one py-spy per process of the session for `seconds`; their raw stacks go to
    out_dir/<role>-<pid>.txt. Returns the py-spy processes (empty when py-spy is not installed)."""
    exe = py_spy()
    if exe is None:
        print("spy: py-spy not found; nothing recorded", flush=True)
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for pid, role in session_processes(session_id):
        cmd = [exe, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", str(rate)]
        cmd += ["--nonblocking", "--idle", "--threads", "--format", "raw", "-o", str(out_dir / f"{role}-{pid}.txt")]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    print(f"spy: recording {len(procs)} processes for {seconds:.0f} s into {out_dir}", flush=True)
    return procs


def summarize(path: Path, top: int = 30) -> str:
    """Per thread of one raw stacks file (recorded with --idle --threads, so a thread's samples are
    its wall time): the share of its samples in which each function was on the stack (inclusive)
    and on top (self). Threads in order of how many distinct stacks they showed (busy ones first)."""
    threads: dict[str, list[tuple[list[str], int]]] = collections.defaultdict(list)
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        thread = frames.pop(0) if frames[0].startswith("thread (") else "all threads"
        threads[thread].append((frames, int(count)))
    lines = [f"== {path.name}"]
    for thread, stacks in sorted(threads.items(), key=lambda kv: -len(kv[1])):
        inclusive, own = collections.Counter(), collections.Counter()
        total = sum(n for _, n in stacks)
        for frames, n in stacks:
            for frame in set(frames):
                inclusive[frame] += n
            own[frames[-1] if frames else "?"] += n
        lines.append(f"-- {thread}: {total} samples, {len(stacks)} distinct stacks; inclusive, then self")
        lines += [f"{100 * n / total:5.1f}%  {name[:140]}" for name, n in inclusive.most_common(top)]
        lines += [f"{100 * n / total:5.1f}%  (self) {name[:133]}" for name, n in own.most_common(top // 3)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    summary = sub.add_parser("summarize", help="print each stacks file's top functions")
    summary.add_argument("path", type=Path)
    summary.add_argument("--top", type=int, default=30)
    args = parser.parse_args(argv)
    files = sorted(args.path.glob("*.txt")) if args.path.is_dir() else [args.path]
    for file in files:
        print(summarize(file, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
