"""Escape attempts against `roll.agentic.sandbox.Sandbox`, run as a script so that a test can run
them as an unprivileged user too: `python sandbox_escapes.py MODE PORT` prints one JSON object,
{"info": sandbox.info() after close, "results": {case: CommandResult fields}, "workspace": path}.

PORT is a listening socket on 127.0.0.1 of the test (the network attempt connects there).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict

from roll.agentic.sandbox import Sandbox

LIMITS = {"wall_s": 3.0, "cpu_s": 1, "max_procs": 8, "memory_mb": 256, "output_bytes": 4096}
SLOW_WALL_S = 30.0  # cpu_burn's wall limit: 1 s of CPU can take longer than 3 s on a busy machine
OUTSIDE = "/roll_sandbox_escape_{uid}"  # the filesystem root: writable by root only
SHARED = "/dev/shm/roll_sandbox_escape_{uid}"  # world-writable, shared with the host


def cases(port: int, outside: str, shared: str) -> dict[str, tuple[str, str]]:
    """name -> (kind, command). Each must be contained within LIMITS."""
    return {
        "network": ("python", f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)"),
        "write_outside": ("shell", f"echo escaped > {outside}"),
        "write_shared": ("shell", f"echo escaped > {shared}"),
        "fork_bomb": ("shell", "bomb() { bomb | bomb & }; bomb; sleep 1"),
        "endless_output": ("shell", "yes 0123456789"),
        "sleep_forever": ("shell", "sleep 100000"),
        "kill_parent": ("shell", "kill -9 $PPID; echo survived"),
        "cpu_burn": ("python", "while True: pass"),
        "memory_hog": ("python", "x = bytearray(1 << 30)"),
        "daemon": ("shell", "(setsid sleep 100000 > /dev/null 2>&1 &); echo started"),
        "workspace_write": ("shell", "echo kept > inside.txt && cat inside.txt"),
    }


def main() -> None:
    mode, port = sys.argv[1], int(sys.argv[2])
    sandbox = Sandbox(LIMITS, isolation_mode=mode)
    patient = Sandbox({**LIMITS, "wall_s": SLOW_WALL_S}, isolation_mode=mode)
    outside, shared = OUTSIDE.format(uid=os.getuid()), SHARED.format(uid=os.getuid())
    results = {}
    for name, (kind, command) in cases(port, outside, shared).items():
        box = patient if name == "cpu_burn" else sandbox
        run = box.run_python if kind == "python" else box.run_shell
        result = asdict(run(command))
        result["output_len"] = len(result["output"])
        result["output"] = result["output"][-300:]
        results[name] = result
    workspace = sandbox.workspace
    sandbox.close()
    patient.close()
    sandbox.violations.update(patient.violations)
    report = {"info": sandbox.info(), "results": results, "workspace": workspace, "outside": outside}
    report |= {"shared": shared, "shared_left": os.path.exists(shared)}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
