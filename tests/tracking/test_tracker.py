"""Tracker: exact metrics.jsonl lines, the same TensorBoard scalars, resume truncation; the bar."""

import json

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.summary.writer import event_file_writer as efw

from roll.tracking import ProgressBar, Tracker


def scalars(logging_dir, tag):
    acc = EventAccumulator(str(logging_dir))
    acc.Reload()
    return [(event.step, event.value) for event in acc.Scalars(tag)]


def test_each_log_call_is_one_flushed_json_line_of_floats(tmp_path):
    tracker = Tracker(tmp_path / "out", tmp_path / "tb")
    tracker.log(
        1,
        {
            "train/success": 0.5,
            "losses/entropy": torch.tensor(1.25),
            "rollout/dropped_trajectories": np.int64(3),
            "val/success": None,
            "flag": True,
        },
    )
    tracker.log(2, {"val/success": np.float32(0.75)})
    # flushed: readable while the run is still going
    assert (tmp_path / "out" / "metrics.jsonl").read_text().splitlines() == [
        ('{"step": 1, "train/success": 0.5, "losses/entropy": 1.25, "rollout/dropped_trajectories": 3.0, "flag": 1.0}'),
        '{"step": 2, "val/success": 0.75}',
    ]
    tracker.close()


def test_tensorboard_gets_the_same_scalars_and_text(tmp_path):
    with Tracker(tmp_path / "out", tmp_path / "tb") as tracker:
        tracker.log(1, {"train/success": 0.5, "losses/entropy": 1.25})
        tracker.log(2, {"train/success": 0.75})
        tracker.log_text(2, "val/episode", "P_G")
    assert scalars(tmp_path / "tb", "train/success") == [(1, 0.5), (2, 0.75)]
    assert scalars(tmp_path / "tb", "losses/entropy") == [(1, 1.25)]
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    [text] = acc.Tensors("val/episode/text_summary")
    assert (text.step, text.tensor_proto.string_val) == (2, [b"P_G"])


def test_step_is_not_a_metric_name(tmp_path):
    with Tracker(tmp_path, tmp_path / "tb") as tracker, pytest.raises(ValueError, match="'step'"):
        tracker.log(1, {"step": 3.0})


def test_resume_drops_what_was_logged_after_the_checkpoint(tmp_path, monkeypatch):
    # The three writers below share one process and usually one second, so their event files are
    # ordered by tensorboard's per-process counter, which is not zero-padded: "...pid.10" sorts
    # before "...pid.9" and the reader would replay the purge after step 4. A real resume is a new
    # process; here the counter starts afresh so that earlier tests cannot shift it across 9 -> 10.
    monkeypatch.setattr(efw, "_global_uid", efw.AtomicCounter(0))
    with Tracker(tmp_path, tmp_path / "tb") as tracker:
        for step in range(1, 6):
            tracker.log(step, {"loss": float(step)})
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 6, "lo')  # killed mid-write
    Tracker(tmp_path, tmp_path / "tb", resume_step=3).close()  # resumed, then killed at once
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").open()] == [1, 2, 3]
    assert scalars(tmp_path / "tb", "loss") == [(1, 1.0), (2, 2.0), (3, 3.0)]
    with Tracker(tmp_path, tmp_path / "tb", resume_step=3) as tracker:
        tracker.log(4, {"loss": 40.0})
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    assert lines == [{"step": s, "loss": v} for s, v in ((1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0))]
    assert scalars(tmp_path / "tb", "loss") == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]


def test_a_damaged_metrics_line_is_kept_aside_and_reported(tmp_path, caplog):
    with Tracker(tmp_path, tmp_path / "tb") as tracker:
        for step in range(1, 4):
            tracker.log(step, {"loss": float(step)})
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "lo')  # killed mid-write
    with caplog.at_level("WARNING"):
        Tracker(tmp_path, tmp_path / "tb", resume_step=3).close()
    assert (tmp_path / "metrics.jsonl.corrupt").read_text() == '{"step": 4, "lo\n'
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"{tmp_path / 'metrics.jsonl'}: 1 damaged line(s) moved to {tmp_path / 'metrics.jsonl.corrupt'}"
    ]
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").open()] == [1, 2, 3]


def test_fresh_run_starts_a_new_metrics_file(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 9, "loss": 1.0}\n')
    with Tracker(tmp_path, tmp_path / "tb") as tracker:
        tracker.log(1, {"loss": 2.0})
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1, "loss": 2.0}\n'


def test_progress_bar_keeps_the_last_validation_success(capsys):
    bar = ProgressBar(total_steps=10, initial=1)
    bar.update(2, {"train/episode_reward": 0.5, "train/success": 0.25, "time/step_s": 1.5})
    assert bar.postfix == {"reward": "0.5", "success": "0.25", "step_s": "1.5"}
    bar.update(3, {"val/success": 0.75, "train/success": 0.5})
    bar.update(4, {"train/episode_reward": torch.tensor(-0.125), "val/success": None})
    assert bar.postfix == {
        "reward": "-0.125",
        "success": "0.5",
        "step_s": "1.5",
        "val_success": "0.75",
    }
    bar.close()
    final = capsys.readouterr().err.split("\r")[-1]
    assert "4/10" in final
    assert "reward=-0.125, success=0.5, val_success=0.75, step_s=1.5" in final
