"""Cost of running a command in `roll.agentic.sandbox.Sandbox` against a plain subprocess.

For `true` (the launch cost alone) and a short Python command, median wall milliseconds per
command: plain `subprocess.run`, the sandbox with rlimits, the sandbox with namespaces (when this
machine can make them), and one code_sandbox grading (all hidden tests of a task in one sandboxed
process). Variants take turns within each repeat, so load hits them all.

    python benchmarks/agents/sandbox_overhead.py [--repeats 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: import from this checkout
from benchmarks.common import timed
from roll.agentic.sandbox import Sandbox
from roll.agentic.sandbox.isolation import namespaces_available

PY = "print(sum(range(1000)))"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    from envs.code_sandbox.grader import grade
    from envs.code_sandbox.tasks import TASKS_BY_NAME

    boxes = {"rlimits": Sandbox(isolation_mode="rlimits")}
    if namespaces_available() is None:
        boxes["namespaces"] = Sandbox(isolation_mode="namespaces")
    task = TASKS_BY_NAME["fibonacci"]
    for box in boxes.values():
        box.write_file("solution.py", task.solution)
    variants = {
        "plain subprocess: true": lambda: subprocess.run(["/bin/sh", "-c", "true"], check=True),
        "plain subprocess: python": lambda: subprocess.run([sys.executable, "-c", PY], check=True, capture_output=True),
    }
    for mode, box in boxes.items():
        variants[f"sandbox {mode}: true"] = lambda box=box: box.run_shell("true")
        variants[f"sandbox {mode}: python"] = lambda box=box: box.run_python(PY)
        variants[f"sandbox {mode}: grade fibonacci (4 tests)"] = lambda box=box: grade(box, task.tests)
    times = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, fn in variants.items():
            times[name].append(timed(fn) * 1000)
    for box in boxes.values():
        box.close()
    base = {kind: statistics.median(times[f"plain subprocess: {kind}"]) for kind in ("true", "python")}
    print(f"load average {os.getloadavg()[0]:.1f}, {args.repeats} repeats, median ms per command")
    print(f"{'variant':45} {'ms':>8} {'x plain':>8}")
    for name, values in times.items():
        kind = "true" if name.endswith("true") else "python"
        print(f"{name:45} {statistics.median(values):8.1f} {statistics.median(values) / base[kind]:8.1f}")


if __name__ == "__main__":
    main()
