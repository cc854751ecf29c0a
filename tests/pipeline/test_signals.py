"""Ctrl-C on a real run (issue 31): SIGINT ends it like SIGTERM, with one line, Ray shut down and
exit status 130; a second Ctrl-C during that shutdown stops the driver at once. Afterwards no
process of the run is left (the run has its own session, so its processes are easy to find)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.ray

ARGS = [
    "--config_path",
    "frozen_lake",
    "--config_name",
    "agent_val_frozen_lake",
    "max_steps=50",
    "eval_steps=0",
    "rollout_batch_size=8",
    "train_env_manager.num_env_groups=2",
    "train_env_manager.group_size=4",
    "actor_train.training_args.per_device_train_batch_size=4",
    "actor_train.training_args.gradient_accumulation_steps=1",
]
STOPPED = "training stopped: SIGINT; resume from the last checkpoint with resume_from_checkpoint=true"


def start(model, out: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "examples/start_agentic_pipeline.py", *ARGS, f"pretrain={model}", f"output_dir={out}"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
        start_new_session=True,
    )


def wait_for_a_step(out: Path, proc: subprocess.Popen, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        path = out / "metrics.jsonl"
        if path.exists() and path.read_text().strip():
            return
        assert proc.poll() is None, "the run ended before its first step"
        time.sleep(0.1)
    raise TimeoutError("no step logged")


def left_in_session(sid: int, wait_s: float = 90) -> list[str]:
    """The run's processes still alive after `wait_s` (the reaper's grace included)."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = []
        for p in psutil.process_iter(["pid", "name"]):
            try:
                if os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(f"{p.pid} {p.info['name']}")
            except (ProcessLookupError, psutil.Error):
                continue
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(1)


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_stops_the_run_cleanly_and_a_second_one_at_once(tiny_model, tmp_path, presses):
    out, log = tmp_path / "run", tmp_path / "run.log"
    proc = start(tiny_model, out, log)
    try:
        wait_for_a_step(out, proc)
        os.kill(proc.pid, signal.SIGINT)  # the driver only, as a terminal's Ctrl-C reaches it first
        if presses == 2:
            time.sleep(0.3)
            os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=120) == 130
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()  # workers' forwarded output (progress bars) may come after the driver's line
    said = [line for line in text.splitlines() if line.startswith(("training stopped", "stopped at once"))]
    assert "Traceback" not in text
    if presses == 1:
        assert said == [STOPPED]
    else:  # the second press lands before the first's line, during the clean stop, or after it ended
        again = "stopped at once: SIGINT again"
        assert said in ([STOPPED], [STOPPED, again], [again])
    assert left_in_session(proc.pid) == []
