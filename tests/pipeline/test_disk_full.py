"""A disk that fills in the middle of a run (issue 31): one line naming the directory and the space a
checkpoint needs, exit 1, and the previous checkpoint, metrics.jsonl and the TensorBoard events as
they were. A real full disk: the checkpoints go to a small tmpfs that holds one checkpoint and not
two (mounting needs root; elsewhere the test is skipped). The unit tests below need no mount."""

import errno
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from roll.pipeline.failures.disk_full import is_disk_full
from roll.pipeline.phases import checkpoint as ckpt
from roll.tracking.tracker import Tracker
from tests.faults.timing import detected

REPO = Path(__file__).resolve().parents[2]
ARGS = [
    "--config_path",
    "frozen_lake",
    "--config_name",
    "agent_val_frozen_lake",
    "max_steps=4",
    "save_steps=1",
    "eval_steps=0",
    "rollout_batch_size=8",
    "train_env_manager.num_env_groups=2",
    "train_env_manager.group_size=4",
    "actor_train.training_args.per_device_train_batch_size=4",
    "actor_train.training_args.gradient_accumulation_steps=1",
]


@pytest.fixture
def small_disk(tmp_path):
    """A 10 MiB tmpfs: room for one checkpoint of the tiny FrozenLake model (about 6.5 MB), not two."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=10m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.ray
@pytest.mark.timeout(900)
def test_a_disk_that_fills_stops_the_run_with_one_line_and_keeps_the_last_checkpoint(small_disk, tmp_path):
    from roll.pipeline.tiny_model import main as build

    model = build(["--preset", "frozen_lake", "--output_dir", str(tmp_path / "tiny")])
    out, log = tmp_path / "run", tmp_path / "run.log"
    seen: dict[str, float] = {}  # when the step-2 checkpoint began and when the line came (perf_counter)
    done = threading.Event()

    def watch() -> None:  # polled every 10 ms (the two lines may come within 50 ms): recorded, not asserted
        while not done.wait(0.01):
            metrics = out / "metrics.jsonl"
            if "checkpoint" not in seen and metrics.exists() and metrics.read_text().count("\n") >= 2:
                seen["checkpoint"] = time.perf_counter()  # step 2 is logged, then checkpointed at once
            if "line" not in seen and log.exists() and "\ntraining stopped" in "\n" + log.read_text():
                seen["line"] = time.perf_counter()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    with log.open("w") as stderr_file:
        result = subprocess.run(
            [
                sys.executable,
                "examples/start_agentic_pipeline.py",
                *ARGS,
                f"pretrain={model}",
                f"output_dir={out}",
                f"logging_dir={out}/tb",
                f"+checkpoint_config.output_dir={small_disk}",
            ],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.PIPE,
            stderr=stderr_file,
            text=True,
            timeout=800,
        )
    done.set()
    watcher.join()
    result.stderr = log.read_text()  # as capture_output would have kept it
    if {"checkpoint", "line"} <= seen.keys():
        detected("disk_full_mid_checkpoint", seen["line"] - seen["checkpoint"])
    assert result.returncode == 1, result.stderr[-3000:]
    said = [line for line in result.stderr.splitlines() if line.startswith("training stopped")]
    assert len(said) == 1, result.stderr[-3000:]
    last = said[0]
    assert last.startswith(f"training stopped: step 2: no space left on device in {small_disk}/checkpoints ("), last
    assert (
        "one checkpoint needs about" in last and "the last checkpoint (step_1), metrics and events are intact" in last
    )
    assert "Traceback" not in result.stderr
    root = small_disk / "checkpoints"
    assert ckpt.latest(str(small_disk)) == root / "step_1" and ckpt.damage(root / "step_1") is None
    assert not list(root.glob(".tmp-*"))  # the half-written checkpoint was deleted
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]  # step 2 was logged before its checkpoint failed
    assert list((out / "tb").glob("events.out.tfevents.*"))


@pytest.mark.parametrize(
    ("err", "full"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), True),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), True),
        (RuntimeError('Error while serializing: IoError(Os { code: 28, message: "No space left on device" })'), True),
        (OSError(errno.EACCES, "Permission denied"), False),
        (ValueError("bad value"), False),
    ],
)
def test_a_full_disk_is_recognised_through_wrappers(err, full):
    wrapped = RuntimeError("task failed")
    wrapped.__cause__ = err
    assert is_disk_full(err) is full and is_disk_full(wrapped) is full


def test_a_metrics_line_cut_short_by_a_full_disk_is_taken_back(tmp_path, monkeypatch):
    tracker = Tracker(tmp_path, tmp_path / "tb")
    tracker.log(1, {"a": 1.0})
    real = tracker._file.write

    def half_then_full(data: bytes) -> int:
        real(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tracker._file, "write", half_then_full, raising=False)
    with pytest.raises(OSError):
        tracker.log(2, {"a": 2.0})
    monkeypatch.undo()
    tracker.log(3, {"a": 3.0})
    tracker.close()
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 3]
