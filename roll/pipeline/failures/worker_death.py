"""Why a worker process died, in one line, with advice that fits the cause.

Ray reports every death of an actor's process as `ActorDiedError` with a message that lists
possible causes without telling which. `death_line` tells them apart, from what is on this machine:

- the actor's constructor raised (`actor_init_failed`): the exception's own last line, e.g.
  "ValueError: ...". Resuming cannot help, so the advice is to fix what it names;
- Ray's memory monitor killed it (`OutOfMemoryError`), or the kernel's OOM killer did (the
  `oom_kill` count of this cgroup's `memory.events` grew since `remember_oom_count()`): lack of
  memory, so smaller batches or more memory, then resume;
- the process reported a fatal signal on its way out (Ray's handler writes "*** SIGSEGV received"
  to the worker's `.err` log, Python's faulthandler "Fatal Python error: ..."): that signal;
- none of those: it left no word, as a `kill -9` leaves none; said as such.

Only the process that died is named (its class and pid); whether the run can go on is the
caller's decision (`roll.cli`).
"""

from __future__ import annotations

import re
from pathlib import Path

MEMORY_EVENTS = Path("/sys/fs/cgroup/memory.events")
_oom_count_at_start: int | None = None


def oom_kill_count(path: Path = MEMORY_EVENTS) -> int | None:
    """The kernel's count of OOM kills in this cgroup (cgroup v2), or None where unreadable."""
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def remember_oom_count() -> None:
    """Call at the start of a run: later OOM kills are told from the count then."""
    global _oom_count_at_start
    _oom_count_at_start = oom_kill_count()


def death_line(err: BaseException, last_checkpoint: str, logs_dir: str | Path | None = None) -> str:
    """One line: which worker died, why, and what to do ("resume from ..." only where it helps)."""
    text = str(err)
    who = _who(text)
    resume = f"resume from the last checkpoint ({last_checkpoint}) with resume_from_checkpoint=true"
    if getattr(err, "actor_init_failed", False) or "raised in its creation task" in text:
        return (
            f"a worker process could not start ({who}): {_exception_line(text)}; resuming will not help "
            "until what it names is fixed"
        )
    if type(err).__name__ == "OutOfMemoryError" or "low on memory" in text or _oom_killed():
        return (
            f"a worker process was killed for lack of memory ({who}); lower the batch sizes or give the run "
            f"more memory, then {resume}"
        )
    fatal = _fatal_signal(logs_dir, _pid(text))
    if fatal is not None:
        return f"a worker process died ({who}): {fatal}; {resume}"
    return f"a worker process died ({who}): it was killed without a word, as kill -9 kills; {resume}"


def _who(text: str) -> str:
    name = (
        re.search(r"class_name: (\S+)", text)
        or re.search(r"ray::(\w+)\.", text)
        or re.search(r"The actor (\w+) is unavailable", text)
    )
    pid = _pid(text)
    return ", ".join(filter(None, [name.group(1) if name else None, f"pid {pid}" if pid else None])) or "unknown"


def _pid(text: str) -> int | None:
    found = re.search(r"\bpid[:=] ?(\d+)", text)
    return int(found.group(1)) if found else None


def _exception_line(text: str) -> str:
    """The raised exception's line of a remote traceback ("ValueError: ..."), else its first line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    raised = [line for line in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b:?", line)]
    return (raised or lines or ["(no message)"])[-1]


def _oom_killed() -> bool:
    now = oom_kill_count()
    return _oom_count_at_start is not None and now is not None and now > _oom_count_at_start


def _fatal_signal(logs_dir: str | Path | None, pid: int | None) -> str | None:
    """ "Segmentation fault" (etc.) from the dead worker's `.err` log, when it wrote one."""
    if logs_dir is None or pid is None:
        return None
    for log in Path(logs_dir).glob(f"worker-*-{pid}.err"):
        text = log.read_text(errors="replace")
        found = re.findall(r"\*\*\* (SIG[A-Z]+) received", text) or re.findall(r"Fatal Python error: (.+)", text)
        if found:
            return f"{found[-1].strip()}, reported in {log}"
    return None


def ray_logs_dir() -> str | None:
    """This Ray session's log directory (where workers' `.err` logs are), or None."""
    try:
        import ray._private.worker as ray_worker

        return ray_worker.global_worker.node.get_logs_dir_path()
    except Exception:  # noqa: BLE001 - no session, or Ray moved it: then no signal is read
        return None
