"""What the fault suite measured: for each fault, the seconds from its injection to the line that
names it, and the load they were measured under. Recorded, never asserted (tests assert no wall
times); the table in docs/reliability.md quotes them.

`detected(fault, seconds)` prints one `FAULT fault=... detected_s=... load1=...` line (seen with
`pytest -s`) and merges the figure into the JSON file `$ROLL_FAULT_TIMES` (default
`<tmp>/roll-fault-times.json`), so one pytest run of the suite leaves every figure in one place.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from roll.utils.atomic import write_atomic


def times_path() -> Path:
    return Path(os.environ.get("ROLL_FAULT_TIMES") or Path(tempfile.gettempdir()) / "roll-fault-times.json")


def detected(fault: str, seconds: float) -> None:
    """Record that `fault` was named `seconds` after it was injected (see the module docstring)."""
    load1 = os.getloadavg()[0]
    print(f"FAULT fault={fault} detected_s={seconds:.2f} load1={load1:.2f} cpus={os.cpu_count()}")
    path = times_path()
    try:
        times = json.loads(path.read_text())
    except (OSError, ValueError):
        times = {}
    times[fault] = {"detected_s": round(seconds, 2), "load1": round(load1, 2), "cpus": os.cpu_count()}
    write_atomic(path, json.dumps(times, indent=1, sort_keys=True) + "\n")
