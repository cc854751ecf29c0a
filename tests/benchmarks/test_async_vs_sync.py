"""benchmarks/rollout/async_vs_sync.py's table for several engine delays (`--decode_delay_ms 0,10`): the
speedup per delay, the separate-devices estimate from the sync run's phases, the RESULT line."""

from __future__ import annotations

from pathlib import Path

from benchmarks.rollout import async_vs_sync

REPO = Path(__file__).resolve().parents[2]


def _summary(step_s: float, rollout_s: float, val: float) -> dict:
    return {
        "step_s": step_s, "rollout_s": rollout_s, "train_s": step_s - rollout_s - 0.5, "sync_s": 0.5,
        "staleness": 0.0, "val": [(0, 0.0), (6, val)],
    }  # fmt: skip


def test_each_delay_gets_its_speedup_and_device_estimate(capsys):
    results = {
        ("sync (k=0)", 0.0): [_summary(6.0, 2.0, 0.25)],
        ("async (k=1)", 0.0): [_summary(4.0, 0.1, 0.5)],
        ("sync (k=0)", 10.0): [_summary(9.0, 6.0, 0.25), _summary(7.0, 4.0, 0.25), _summary(8.0, 5.0, 0.25)],
        ("async (k=1)", 10.0): [_summary(4.0, 0.1, 0.125)],
    }
    async_vs_sync.print_table(results)
    lines = capsys.readouterr().out.splitlines()
    # delay 0: 6 / 4 = 1.5; separate devices: 6 / max(2, 6 - 2) = 1.5
    assert "delay 0 ms: async 1.50x sync; on separate devices (from the phases) 1.50x" in lines
    # delay 10: medians 8 s a step, 5 s rollout: 8 / 4 = 2.0; 8 / max(5, 3) = 1.6
    assert "delay 10 ms: async 2.00x sync; on separate devices (from the phases) 1.60x" in lines
    assert lines[-1] == (
        "RESULT async_speedup_delay0=1.50 val_success_sync_delay0=0.250 val_success_async_delay0=0.500 "
        "async_speedup_delay10=2.00 val_success_sync_delay10=0.250 val_success_async_delay10=0.125"
    )


def test_one_delay_keeps_the_plain_result_names(capsys):
    async_vs_sync.print_table(
        {("sync (k=0)", 0.0): [_summary(3.0, 1.0, 0.0)], ("async (k=1)", 0.0): [_summary(2.0, 0.1, 0.0)]}
    )
    assert capsys.readouterr().out.splitlines()[-1].startswith("RESULT async_speedup=1.50 val_success_sync=0.000")
