"""benchmarks/rollout/rollout_steady.py (`rollout_throughput.py --steady_batches`): batches are collected as
the async pipeline collects steps with partial rollout, only batches 2..N are counted, nothing
dispatched is left running; the median run and the engine curve's interpolation by hand. The run
through real Ray actors is the smoke test at the end (lane)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks.rollout import rollout_steady
from benchmarks.rollout.rollout_steady import SteadyRun

REPO = Path(__file__).resolve().parents[2]

GROUP = 2  # trajectories a group
FIELDS = ("requests", "forwards", "busy_s", "prefill_tokens")


class ScriptedScheduler:
    """Records dispatch and collect; every group is two trajectories of 3 tokens and 1 action."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.dispatched: set[int] = set()

    def dispatch(self, step: int, num_groups: int) -> None:
        if step not in self.dispatched:
            self.dispatched.add(step)
            self.calls.append(("dispatch", step))

    def collect(self, step: int, num_groups: int, first_done: bool = False):
        assert first_done and step in self.dispatched
        self.calls.append(("collect", step))
        return [SimpleNamespace(num_generated_tokens=3, num_actions=1)] * (num_groups * GROUP), []


def test_a_run_collects_as_the_pipeline_does_and_leaves_nothing_running(monkeypatch):
    reads = iter(
        [
            {"requests": 10, "forwards": 2, "busy_s": 1.0, "prefill_tokens": 100},
            {"requests": 70, "forwards": 12, "busy_s": 2.5, "prefill_tokens": 1300},
        ]
    )
    monkeypatch.setattr(rollout_steady, "engine_snapshot", lambda inference: next(reads))
    scheduler = ScriptedScheduler()
    run = rollout_steady.steady_run("async", scheduler, None, first=5, batches=3, num_groups=4, ahead=1)
    assert scheduler.calls == [
        ("dispatch", 5), ("dispatch", 6), ("collect", 5),  # batch 5 fills the pipe (untimed)
        ("dispatch", 7), ("collect", 6),
        ("dispatch", 8), ("collect", 7),
        ("collect", 8),  # dispatched ahead: collected, nothing new dispatched
    ]  # fmt: skip
    # batches 6 and 7: 2 x 4 groups x 2 trajectories
    assert (run.trajectories, run.generated_tokens, run.env_steps) == (16, 48, 16)
    assert (run.requests, run.forwards, run.engine_busy_s, run.rows_per_forward) == (60, 10, 1.5, 6.0)
    assert (run.prefill_tokens, run.rows_per_busy_s) == (1200, 40.0)
    assert run.traj_per_s == pytest.approx(16 / run.seconds)


def test_k0_drains_every_batch(monkeypatch):
    monkeypatch.setattr(rollout_steady, "engine_snapshot", lambda inference: dict.fromkeys(FIELDS, 0))
    scheduler = ScriptedScheduler()
    rollout_steady.steady_run("bound", scheduler, None, first=1, batches=2, num_groups=1, ahead=0)
    assert scheduler.calls == [("dispatch", 1), ("collect", 1), ("dispatch", 2), ("collect", 2)]


def _run(mode: str, ahead: int, traj_per_s: float) -> SteadyRun:
    return SteadyRun(mode, ahead, 1.0, int(traj_per_s), 0, 0, 0, 0, 0.0)


def test_the_table_takes_each_k_and_modes_median_run():
    runs = [_run("async", 1, x) for x in (30, 10, 20)] + [_run("bound", 1, x) for x in (40, 50)]
    table = rollout_steady.summarize(runs)
    assert table[1]["async"].traj_per_s == 20
    assert table[1]["bound"].traj_per_s == 40  # an even count: the lower middle


def test_the_curve_is_read_between_its_points():
    curve = [{"rows_per_call": 32, "rows_per_s": 400}, {"rows_per_call": 128, "rows_per_s": 800}]
    assert rollout_steady.rows_per_s_at(curve, 80) == pytest.approx(600)  # halfway
    assert rollout_steady.rows_per_s_at(curve, 8) == 400  # below the first point: its value
    assert rollout_steady.rows_per_s_at(curve, 256) == 800


@pytest.mark.ray
@pytest.mark.lane
def test_smoke_the_steady_mode_through_real_workers(tmp_path):
    record = tmp_path / "steady.json"
    cmd = [
        sys.executable, "benchmarks/rollout/rollout_throughput.py", "--steady_batches", "3", "--trajectories", "16",
        "--concurrent_envs", "16", "--group_size", "8", "--max_turns", "2", "--median_ms", "2", "--ahead", "0,1",
        "--repeats", "1", "--engine_sweep", "8,16", "--record", str(record),
    ]  # fmt: skip
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines()[-1].startswith("RESULT async_over_bound_k0=")
    runs = json.loads(record.read_text())["runs"]
    assert {(r["mode"], r["ahead"]) for r in runs} == {("async", 0), ("bound", 0), ("async", 1), ("bound", 1)}
    assert all(r["trajectories"] == 32 and r["requests"] > 0 for r in runs)  # batches 2 and 3
