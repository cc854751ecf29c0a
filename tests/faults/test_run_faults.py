"""Faults in a real run of the FrozenLake example (the CLI in a session of its own, Ray and all):
NaN losses, and the death of the critic or the reference worker.

NaN losses: the critic is loaded from a copy of the model whose weights are all NaN, so its values,
the advantages and both losses are non-finite. Every update is skipped and counted
(`actor/skipped_steps`, `critic/skipped_steps` in metrics.jsonl), and when the streak reaches
`max_consecutive_skipped_steps` the run stops with one line, exit 1, before a checkpoint of the
skipped step is written. A killed critic or reference (SIGKILL after step 1 was logged and
checkpointed) cannot be rebuilt mid-run (the critic's optimizer state is gone; the reference is
not restarted either): one line names the dead worker and says to resume, exit 1; every logged
step and the checkpoint stay whole.

In .ci/run_lanes (lane "slow"): each is a Ray run of about a minute on 2 cores."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from roll.pipeline.phases import checkpoint as ckpt
from tests.faults.timing import detected

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.ray, pytest.mark.lane]
ARGS = [
    "--config_path",
    "frozen_lake",
    "--config_name",
    "agent_val_frozen_lake",
    "save_steps=1",
    "eval_steps=0",
    "rollout_batch_size=8",
    "train_env_manager.num_env_groups=2",
    "train_env_manager.group_size=4",
    "train_env_manager.env_manager_type=traj",
    "val_env_manager.env_manager_type=traj",
    "actor_train.training_args.per_device_train_batch_size=8",
    "actor_train.training_args.gradient_accumulation_steps=1",
    "adv_estimator=gae",
    "+critic.strategy_args.strategy_name=torch",
]


@pytest.fixture(scope="module")
def nan_model(tiny_model, tmp_path_factory):
    """The tiny model with every weight NaN (its tokenizer unchanged)."""
    from safetensors.torch import load_file, save_file

    path = tmp_path_factory.mktemp("nan") / "tiny"
    shutil.copytree(tiny_model, path)
    weights = load_file(str(path / "model.safetensors"))
    save_file({k: v.fill_(float("nan")) for k, v in weights.items()}, str(path / "model.safetensors"))
    return str(path)


def start(model: str, out: Path, log: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "examples/start_agentic_pipeline.py", *ARGS, *args, f"pretrain={model}", f"output_dir={out}"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
        start_new_session=True,
    )


def rows(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def stopped(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith("training stopped")]


def finish(proc: subprocess.Popen, timeout: float) -> int:
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.timeout(900)
def test_nan_losses_are_skipped_counted_and_stop_the_run_with_one_line(tiny_model, nan_model, tmp_path):
    out, log = tmp_path / "run", tmp_path / "run.log"
    proc = start(
        tiny_model,
        out,
        log,
        "max_steps=6",
        "max_consecutive_skipped_steps=2",
        f"+critic.model_args.model_name_or_path={nan_model}",
    )
    began = time.perf_counter()
    assert finish(proc, 600) == 1, log.read_text()[-3000:]
    detected("nan_losses", time.perf_counter() - began)  # from start-up: the NaN is there from the first update
    (row,) = rows(out)  # the step is logged, with what was skipped
    assert row["step"] == 1 and row["actor/skipped_steps"] >= 2 and row["critic/skipped_steps"] >= 2
    assert row["actor/consecutive_skipped_steps"] == row["actor/skipped_steps"]
    (line,) = stopped(log)
    assert line.startswith("training stopped: step 1: the last ") and "non-finite loss" in line, line
    assert "(max_consecutive_skipped_steps=2)" in line
    assert ckpt.latest(str(out)) is None  # the skipped step is not checkpointed as if it had trained


def wait_for_step(out: Path, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 600
    while not (rows(out) and ckpt.latest(str(out)) is not None):
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.1)


def kill_one(proc: subprocess.Popen, title: str) -> int:
    import psutil

    for p in psutil.process_iter(["pid", "name"]):
        try:
            if os.getsid(p.pid) == proc.pid and (p.info["name"] or "").startswith(title):
                p.send_signal(signal.SIGKILL)
                return p.pid
        except (ProcessLookupError, psutil.Error):
            continue
    raise AssertionError(f"no {title} process in the run")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("worker", ["CriticWorker", "ReferenceWorker"])
def test_a_killed_critic_or_reference_stops_the_run_saying_to_resume(tiny_model, tmp_path, worker):
    out, log = tmp_path / "run", tmp_path / "run.log"
    kl = ["init_kl_coef=0.1", "+reference.strategy_args.strategy_name=torch"] if worker == "ReferenceWorker" else []
    proc = start(tiny_model, out, log, "max_steps=24", *kl)
    try:
        wait_for_step(out, proc, log)
        pid = kill_one(proc, f"ray::{worker}")
        killed = time.perf_counter()
        status = finish(proc, 600)
    finally:
        finish(proc, 0.1) if proc.poll() is None else None
    detected(f"{worker}_killed", time.perf_counter() - killed)
    assert status == 1, log.read_text()[-3000:]
    (line,) = stopped(log)
    assert line.startswith(f"training stopped: a worker process died ({worker}, pid {pid}): "), line
    assert line.endswith("with resume_from_checkpoint=true"), line
    logged = rows(out)
    assert [r["step"] for r in logged] == list(range(1, len(logged) + 1))  # whole lines, none twice
    last = ckpt.latest(str(out))
    assert last is not None and ckpt.read_state(last)["step"] >= 1  # the last checkpoint intact (its manifest)
