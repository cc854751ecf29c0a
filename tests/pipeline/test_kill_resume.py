"""kill -9 at random moments, resume each time: the run ends with every step logged once and the
same numbers as a run that was never killed.

One run of the FrozenLake example (small batches, a checkpoint every step) is started with
`resume_from_checkpoint=true` and killed with SIGKILL (its whole process group: driver and Ray)
three times, in an order drawn from a seeded generator: once during start-up; once at a moment
drawn from that generator after the run has logged a new step (rollout, training, validation, a
checkpoint being written: wherever it lands), so that the restart makes progress; once while a
checkpoint is half written (the driver is started through a wrapper that announces each
checkpoint commit and pauses before it, so the kill lands with the model files written and the
trainer state and manifest not). Each kind of moment once: the seven kills this test once made
(four after a step, two mid-checkpoint) proved nothing the three do not, at twice the CI time.
After every kill the newest complete checkpoint must load with `transformers`. Then the run is
left to finish, and its metrics must equal an uninterrupted run's at every step.

It runs in .ci/run_lanes (lane "slow"): at about 90 s it was the gate's longest test. The gate keeps
what it stands on: commits and half-written or damaged checkpoints (tests/pipeline/test_checkpoint.py)
and a resume that reproduces an uninterrupted run (tests/pipeline/test_end_to_end.py).
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from roll.pipeline.phases import checkpoint as ckpt

REPO = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.ray,
    pytest.mark.lane,
]  # .ci/run_lanes (slow); .ci/run keeps the unit tests of tests/pipeline/test_checkpoint.py

MAX_STEPS = 6
ARGS = [
    "--config_path",
    "frozen_lake",
    "--config_name",
    "agent_val_frozen_lake",
    f"max_steps={MAX_STEPS}",
    "save_steps=1",
    "eval_steps=3",
    "rollout_batch_size=8",
    "train_env_manager.num_env_groups=2",
    "train_env_manager.group_size=4",
    "val_batch_size=4",
    "val_env_manager.num_env_groups=4",
    "actor_train.training_args.per_device_train_batch_size=4",
    "actor_train.training_args.gradient_accumulation_steps=1",
    "resume_from_checkpoint=true",
]
# The CLI, with checkpoint commits announced on stderr and paused for PAUSE_COMMIT_S seconds.
WRAPPER = """
import os, sys, time
from roll.pipeline.phases import checkpoint
_commit = checkpoint.commit
def commit(output_dir, tmp, step, state):
    print(f"COMMITTING step_{step}", file=sys.stderr, flush=True)
    time.sleep(float(os.environ.get("PAUSE_COMMIT_S", "0")))
    return _commit(output_dir, tmp, step, state)
checkpoint.commit = commit
from roll.cli import main
sys.exit(main(sys.argv[1:], examples_dir=os.path.join(os.getcwd(), "examples")))
"""


def start(model, out: Path, log: Path, pause_s: float = 0.0) -> subprocess.Popen:
    env = {**os.environ, "PAUSE_COMMIT_S": str(pause_s)}
    return subprocess.Popen(
        [sys.executable, "-c", WRAPPER, *ARGS, f"pretrain={model}", f"output_dir={out}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
        start_new_session=True,
    )  # its own process group: the kill takes Ray too


def kill(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def wait_for(log: Path, text: str, proc: subprocess.Popen, timeout_s: float = 300) -> bool:
    """True once `text` is in the log; False if the process ended first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if text in log.read_text():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    raise TimeoutError(f"{text!r} not seen in {timeout_s}s")


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def logged_lines(out: Path) -> int:
    path = out / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def wait_for_new_step(out: Path, before: int, proc: subprocess.Popen, timeout_s: float = 300) -> bool:
    """True once metrics.jsonl has more lines than `before`; False if the process ended first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if logged_lines(out) > before:
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    raise TimeoutError(f"no new step logged in {timeout_s}s")


def assert_latest_checkpoint_loads(out: Path) -> int:
    """The step of the newest complete checkpoint (0: none yet), after loading it."""
    from transformers import AutoModelForCausalLM

    path = ckpt.latest(str(out))
    if path is None:
        return 0
    AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    return ckpt.read_state(path)["step"]


@pytest.mark.timeout(1200)
def test_three_kills_and_resumes_end_like_an_uninterrupted_run(tiny_model, tmp_path):
    procs: list[subprocess.Popen] = []
    try:
        _sweep(tiny_model, tmp_path, procs)
    finally:  # a failed assertion or a timeout must not leave a run (and its Ray) behind
        for proc in procs:
            if proc.poll() is None:
                kill(proc)


def _sweep(tiny_model, tmp_path: Path, procs: list) -> None:
    reference = tmp_path / "reference"
    procs.append(proc := start(tiny_model, reference, tmp_path / "reference.log"))
    assert proc.wait(timeout=600) == 0, (tmp_path / "reference.log").read_text()[-3000:]

    out, rng, saved = tmp_path / "killed", random.Random(1234), []
    plan = ["start-up"] + rng.sample(["after-a-step", "mid-checkpoint"], 2)
    for k, how in enumerate(plan):
        log = tmp_path / f"run{k}.log"
        before = logged_lines(out)
        procs.append(proc := start(tiny_model, out, log, pause_s=30.0 if how == "mid-checkpoint" else 0.0))
        if how == "start-up":
            time.sleep(rng.uniform(1.0, 5.0))
        elif how == "after-a-step":
            wait_for_new_step(out, before, proc)
            time.sleep(rng.uniform(0.0, 1.5))
        else:  # the next commit has begun: kill it half-way
            wait_for(log, "COMMITTING", proc)
            time.sleep(0.5)
        if proc.poll() is not None:  # it finished before the kill: the sweep has no more to do
            break
        kill(proc)
        saved.append(assert_latest_checkpoint_loads(out))
    assert len(saved) == len(plan) and saved == sorted(saved)  # a kill never loses a complete checkpoint
    log = tmp_path / "final.log"
    procs.append(proc := start(tiny_model, out, log))
    assert proc.wait(timeout=600) == 0, log.read_text()[-3000:]

    got, want = metrics(out), metrics(reference)
    assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(MAX_STEPS + 1))
    for a, b in zip(got, want):
        for key in (
            "train/episode_reward",
            "train/success",
            "losses/policy_loss",
            "losses/entropy",
            "actor/lr",
            "val/success",
        ):
            if key in b:
                assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (b["step"], key)
    assert assert_latest_checkpoint_loads(out) == MAX_STEPS
    assert not list((out / "checkpoints").glob(".tmp-*"))  # leftovers of killed writes were cleared
