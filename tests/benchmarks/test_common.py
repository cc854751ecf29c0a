"""benchmarks/common.py: the helpers print the exact text the scripts printed before them."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

from benchmarks import common

REPO = Path(__file__).resolve().parents[2]


def test_result_line_with_and_without_a_name():
    assert (
        common.result_line("score_turns", {"a_ratio": 1.234, "b_ratio": 2})
        == "RESULT score_turns a_ratio=1.23 b_ratio=2.00"
    )
    assert common.result_line("", {"x": 0.5}, digits=3) == "RESULT x=0.500"


def test_result_line_with_digits_per_key():
    values = {"speedup": 1.234, "val": 0.9, "discarded": 3.0}
    assert (
        common.result_line("", values, digits={"val": 3, "discarded": 0}) == "RESULT speedup=1.23 val=0.900 discarded=3"
    )


def test_load_line_and_load_span(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (1.234, 5.0, 12.345))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert common.load_line() == "2 cores, load average 1.23 5.00 12.35 at start"
    assert common.load_line(16) == "16 cores, load average 1.23 5.00 12.35 at start"
    assert common.load_line(load=(4.0, 3.0, 2.0)) == "2 cores, load average 4.00 3.00 2.00 at start"
    assert common.load_span(0.26) == "load 0.3 -> 1.2"


def test_clock_and_timed_measure_the_block(monkeypatch):
    ticks = iter([10.0, 12.0, 3.0, 3.25])  # perf_counter: 2 wall seconds, then 0.25
    cpu = iter([1.0, 1.5])  # process_time: 0.5 CPU seconds
    clocks = SimpleNamespace(perf_counter=lambda: next(ticks), process_time=lambda: next(cpu))
    monkeypatch.setattr(common, "time", clocks)  # only common's clocks, not pytest's
    with common.Clock() as clock:
        pass
    assert (clock.wall, clock.cpu) == (2.0, 0.5)
    assert clock.rates(10) == (5.0, 20.0)
    calls = []
    assert common.timed(calls.append, 7) == 0.25 and calls == [7]


def test_repo_is_the_repository_root():
    assert common.REPO == REPO and (common.REPO / "benchmarks" / "common.py").is_file()
