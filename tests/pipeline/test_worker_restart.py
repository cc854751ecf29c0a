"""Workers that die in the middle of a run (issue 31).

An env worker and an inference engine, each killed with SIGKILL at moments drawn from a seeded
generator after a step was logged (once in .ci/run; three times in one run in the `lane` variant),
are restarted by Ray; the engine loads the weights of the last sync (never the initial model
again), the groups that were being played are played again, what was lost is counted
(`rollout/dropped_trajectories`), and the run goes on: every step is logged once. A training rank
killed the same way cannot be rebuilt (its optimizer state is gone): the run stops with one line
that names the dead worker and says to resume, exit 1.
"""

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.faults.timing import detected

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.ray
STEPS_PER_ROUND = 8  # kills land in the first half: a fast machine must not finish the run before the last one
ARGS = [
    "--config_path",
    "frozen_lake",
    "--config_name",
    "agent_val_frozen_lake",
    "eval_steps=0",
    "save_steps=4",
    "rollout_batch_size=8",
    "train_env_manager.num_env_groups=2",
    "train_env_manager.group_size=4",
    "actor_train.training_args.per_device_train_batch_size=8",
    "actor_train.training_args.gradient_accumulation_steps=1",
]


def start(model, out: Path, log: Path, max_steps: int) -> subprocess.Popen:
    return start_run(model, out, log, [*ARGS, f"max_steps={max_steps}"])


def start_run(model, out: Path, log: Path, args: list[str]) -> subprocess.Popen:
    """The CLI with `args` in a session of its own (its processes are found by session id)."""
    run = [*args, f"pretrain={model}", f"output_dir={out}"]
    return subprocess.Popen(
        [sys.executable, "examples/start_agentic_pipeline.py", *run],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
        start_new_session=True,
    )


def workers(sid: int, title: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["pid", "name"]):
        try:
            if os.getsid(proc.pid) == sid and (proc.info["name"] or "").startswith(title):
                found.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return found


def steps(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for_step(out: Path, at_least: int, proc: subprocess.Popen, timeout_s: float = 600) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(steps(out)) >= at_least:
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.1)
    raise TimeoutError(f"step {at_least} not logged in {timeout_s}s")


class LineTimes(threading.Thread):
    """When each line of the log at `path` first appeared (`time.perf_counter`, polled every 50 ms
    while the run writes it): what the fault suite records (tests/faults/timing.py), never asserted."""

    def __init__(self, path: Path):
        super().__init__(daemon=True)
        self.path, self.done = path, threading.Event()
        self.lines: list[tuple[float, str]] = []

    def run(self) -> None:
        offset, rest = 0, b""
        while True:
            stop = self.done.wait(0.05)
            try:
                with self.path.open("rb") as f:
                    f.seek(offset)
                    data = f.read()
            except FileNotFoundError:
                data = b""
            offset, now = offset + len(data), time.perf_counter()
            *whole, rest = (rest + data).split(b"\n")
            self.lines += [(now, line.decode(errors="replace")) for line in whole]
            if stop:
                return

    def stop(self) -> None:
        self.done.set()
        self.join()

    def since(self, moment: float, pattern: str) -> float | None:
        """Seconds from `moment` to the first line after it that matches `pattern`, if any."""
        return next((t - moment for t, line in self.lines if t >= moment and re.search(pattern, line)), None)


def kill_one(proc: subprocess.Popen, title: str) -> int:
    victims = []
    deadline = time.monotonic() + 180  # a restarted worker may be coming up: over a minute on a loaded machine
    while not victims and time.monotonic() < deadline:
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before {title} was killed"
        victims = workers(proc.pid, title)
        time.sleep(0.2)
    assert victims, f"no {title} process in the run"
    victim = victims[0]
    victim.send_signal(signal.SIGKILL)
    return victim.pid


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("rounds", [1, pytest.param(3, marks=pytest.mark.lane)])  # three rounds: .ci/run_lanes
def test_killed_env_workers_and_engines_come_back_and_every_step_is_logged(tiny_model, tmp_path, rounds):
    out, log, rng = tmp_path / "run", tmp_path / "run.log", random.Random(31)
    max_steps = STEPS_PER_ROUND * rounds
    proc = start(tiny_model, out, log, max_steps)
    kills = []  # (worker, step logged before the kill)
    killed_at = []  # (worker, time.perf_counter() of the kill): recorded, not asserted
    lines = LineTimes(log)
    lines.start()
    try:
        moments = sorted(rng.sample(range(1, max_steps // 2), rounds))
        for after_step in moments:
            assert wait_for_step(out, after_step, proc), log.read_text()[-3000:]
            for title in ("ray::EnvWorker", "ray::InferenceWorker"):  # one of each, at a random moment
                time.sleep(rng.uniform(0.0, 1.0))  # inside a rollout or between: wherever it lands
                kills.append((title, len(steps(out)), kill_one(proc, title)))
                killed_at.append((title, time.perf_counter()))
        assert proc.wait(timeout=900) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        lines.stop()
    # seconds from each kill to the first line that names it: an env worker's dropped episode (logged
    # with the step's metrics), an engine's restart; the slowest of each kind is recorded
    for title, fault, named in (
        ("ray::EnvWorker", "env_worker_killed", r"dropped a trajectory: env worker \S+ died"),
        ("ray::InferenceWorker", "inference_engine_killed", r"inference worker restarted"),
    ):
        seconds = [lines.since(moment, named) for worker, moment in killed_at if worker == title]
        found = [s for s in seconds if s is not None]
        if found and len(found) == len(seconds):
            detected(fault, max(found))
        else:
            print(f"FAULT fault={fault}: no line named the kill ({seconds})")
    rows, text = steps(out), log.read_text()
    assert [r["step"] for r in rows] == list(range(1, max_steps + 1))
    assert all(r["train/episode_reward"] == r["train/episode_reward"] for r in rows)  # no NaN: whole batches
    dropped = sum(r["rollout/dropped_trajectories"] for r in rows)
    assert dropped == text.count(": dropped a trajectory: ")  # each lost episode counted and named
    # each restarted engine loaded the weights of the last sync, never the initial model again
    restored = [int(v) for v in re.findall(r"inference worker restarted: serving the weights of version (\d+)", text)]
    engine_kills = [logged for title, logged, _ in kills if title == "ray::InferenceWorker"]
    assert len(restored) == len(engine_kills), text[-3000:]
    assert all(version >= logged for version, logged in zip(restored, engine_kills, strict=True))


@pytest.mark.timeout(900)
def test_a_killed_training_rank_stops_the_run_saying_to_resume(tiny_model, tmp_path):
    out, log = tmp_path / "run", tmp_path / "run.log"
    proc = start(tiny_model, out, log, 24)  # stopped at step 1 by the kill
    try:
        assert wait_for_step(out, 1, proc), log.read_text()[-3000:]
        pid = kill_one(proc, "ray::ActorWorker")
        killed = time.perf_counter()
        assert proc.wait(timeout=600) == 1
        detected("training_rank_killed", time.perf_counter() - killed)  # recorded, not asserted
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    said = [line for line in log.read_text().splitlines() if line.startswith("training stopped")]
    assert len(said) == 1, log.read_text()[-3000:]
    assert said[0].startswith(f"training stopped: a worker process died (ActorWorker, pid {pid}): "), said[0]
    assert said[0].endswith("with resume_from_checkpoint=true")
