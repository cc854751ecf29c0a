"""Shared helpers of the benchmark scripts: timing, the machine's load, the RESULT line, the tiny model.

A script imports it as `benchmarks.common` (run by path, a script first puts the repository root on
sys.path; the tests have it there). Contract: this module imports no other benchmark script, so the
scripts' imports of each other stay free of cycles (tests/benchmarks/test_imports.py); each helper
prints nothing and keeps the exact text the scripts printed before it existed, so results pages stay
comparable.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class Clock:
    """Wall-clock and process CPU seconds of a `with` block. On a shared machine the CPU time
    is the steadier measure: it leaves out the time other jobs held the cores."""

    def __enter__(self) -> Clock:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu

    def rates(self, count: int) -> tuple[float, float]:
        """(`count` per wall-clock second, `count` per CPU second)."""
        return count / self.wall, count / max(self.cpu, 1e-9)


def timed(fn: Callable[..., object], *args: object) -> float:
    """Wall-clock seconds `fn(*args)` takes."""
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def load_line(cores: int | None = None, load: Sequence[float] | None = None) -> str:
    """`N cores, load average 1m 5m 15m at start`; N is os.cpu_count() and the load os.getloadavg()
    unless given (a script reads the load before its runs and prints the line after them)."""
    load = os.getloadavg() if load is None else load
    count = os.cpu_count() if cores is None else cores
    return f"{count} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at start"


def load_span(before: float) -> str:
    """`load B -> A`: the 1-minute load average `before` a run (os.getloadavg()[0]) and now."""
    return f"load {before:.1f} -> {os.getloadavg()[0]:.1f}"


def result_line(name: str, values: Mapping[str, float], digits: int | Mapping[str, int] = 2) -> str:
    """`RESULT name key=value ...`, each value with `digits` decimals (one count, or a count per key,
    2 for a key not named); no name: `RESULT key=value ...`."""
    places = (lambda key: digits) if isinstance(digits, int) else (lambda key: digits.get(key, 2))
    return " ".join(["RESULT", *([name] if name else []), *(f"{k}={v:.{places(k)}f}" for k, v in values.items())])


def tiny_model(preset: str, out: Path) -> Path:
    """The tiny model of `preset` (roll.pipeline.tiny_model), built under `out/models/tiny-<preset>`."""
    path = out / "models" / f"tiny-{preset}"
    subprocess.run(
        [sys.executable, "-m", "roll.pipeline.tiny_model", "--preset", preset, "--output_dir", str(path)],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    return path
