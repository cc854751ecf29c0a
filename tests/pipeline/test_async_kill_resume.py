"""kill -9 of an async run with partial rollout, then resume: every step is logged once and every
group of trajectories is trained once, failed (counted), or still owed at the end.

The long-tailed FrozenLake workload of tests/pipeline/test_partial_rollout_runs.py (async k = 1,
`partial_rollout: true`, answers of 32 and 256 tokens, each decode step stretched 5 ms so that
syncs land mid-generation), a checkpoint every step, is started with `resume_from_checkpoint=true`
and killed with SIGKILL (its whole process group: driver and Ray) twice:
- after a step is logged past a checkpoint, at a moment drawn from a seeded generator;
- during a weight sync while the engine holds interrupted requests: the driver is started through
  a wrapper that gives every Ray worker a setup hook (`worker_process_setup_hook`); in the
  inference worker it holds the weight load of the first sync that finds continued requests
  waiting, after writing a marker file, so the kill lands with requests suspended.
After each kill the newest checkpoint must load with `transformers`. Then the run is left to
finish. Which groups finish first, their tokens and the losses depend on timing in async
training, so they are not compared with an uninterrupted run; what must hold is compared:
- metrics.jsonl has steps 1..max_steps once each, and TensorBoard the same scalars at the same steps;
- every step trains a full batch (`rollout/kept_trajectories`), and the group ledger adds up
  (`rollout/outstanding_groups` of a step = the previous step's + dispatched - collected -
  failed); a resumed step replays what its checkpoint owed (`rollout/replayed_groups`);
- the traces (`trace_rollouts`) name each group identity (`train-<step>-<index>`) at most once
  over the whole run, every identity dispatched is trained or still owed at the end.

It runs in .ci/run_lanes (lane "slow"), like tests/pipeline/test_kill_resume.py (the sync run).
"""

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.pipeline.test_kill_resume import assert_latest_checkpoint_loads, kill, logged_lines, metrics

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.ray, pytest.mark.lane]  # .ci/run_lanes (slow)

MAX_STEPS = 6
GROUPS_PER_STEP, GROUP_SIZE = 2, 4
ARGS = [
    "--config_path",
    "benchmarks/configs",
    "--config_name",
    "long_tail_frozen_lake",
    f"max_steps={MAX_STEPS}",
    "save_steps=1",
    "async_generation_ratio=1",
    "partial_rollout=true",
    f"rollout_batch_size={GROUPS_PER_STEP * GROUP_SIZE}",
    f"train_env_manager.group_size={GROUP_SIZE}",
    "train_env_manager.num_env_groups=4",
    "train_env_manager.tags=[LongLake,ShortLake]",
    "train_env_manager.num_groups_partition=[2,2]",
    "custom_envs.LongLake.max_steps=2",
    "actor_train.training_args.per_device_train_batch_size=16",
    "actor_train.training_args.gradient_accumulation_steps=1",
    "+actor_infer.system_envs.ROLL_DECODE_DELAY_MS='5'",
    "trace_rollouts=true",
    "resume_from_checkpoint=true",
]
# The CLI; with HOLD_SYNC_MARKER set, every Ray worker gets a setup hook that, in the inference
# worker, holds the first weight load that finds interrupted requests waiting to continue.
WRAPPER = """
import os, sys
import ray

marker = os.environ.get("HOLD_SYNC_MARKER")

def hold_a_sync_with_requests_suspended():
    import json, time
    from roll.distributed.workers import inference
    load = inference.InferenceWorker._load
    def _load(self, state_dict, version):
        suspended = len(self.partial._continued)
        if suspended:
            with open(marker + ".tmp", "w") as f:
                json.dump({"version": version, "suspended": suspended, "queued": len(self._pending)}, f)
            os.replace(marker + ".tmp", marker)
            time.sleep(3600)
        return load(self, state_dict, version)
    inference.InferenceWorker._load = _load

if marker:
    _init = ray.init
    def init(*args, **kwargs):
        outer = kwargs.setdefault("runtime_env", {})
        outer["worker_process_setup_hook"] = hold_a_sync_with_requests_suspended
        return _init(*args, **kwargs)
    ray.init = init
from roll.cli import main
sys.exit(main(sys.argv[1:], examples_dir=os.path.join(os.getcwd(), "examples")))
"""


def start(model, out: Path, log: Path, marker: Path | None = None) -> subprocess.Popen:
    env = {**os.environ}
    env.pop("HOLD_SYNC_MARKER", None)
    if marker is not None:
        env["HOLD_SYNC_MARKER"] = str(marker)
    return subprocess.Popen(
        [sys.executable, "-c", WRAPPER, *ARGS, f"pretrain={model}", f"output_dir={out}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
        start_new_session=True,
    )  # its own process group: the kill takes Ray too


def wait_until(done, proc: subprocess.Popen, what: str, timeout_s: float = 300) -> bool:
    """True once `done()`; False if the process ended first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if done():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    raise TimeoutError(f"{what} not seen in {timeout_s}s")


def tensorboard_scalars(logging_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logging_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


@pytest.mark.timeout(1500)
def test_an_async_run_killed_twice_logs_each_step_once_and_trains_each_group_once(tiny_model, tmp_path):
    procs: list[subprocess.Popen] = []
    try:
        _kill_and_resume(tiny_model, tmp_path, procs)
    finally:  # a failed assertion or a timeout must not leave a run (and its Ray) behind
        for proc in procs:
            if proc.poll() is None:
                kill(proc)


def _kill_and_resume(tiny_model, tmp_path: Path, procs: list) -> None:
    out, rng, saved = tmp_path / "run", random.Random(52), []
    # 1. after a step logged past a checkpoint
    log = tmp_path / "run0.log"
    procs.append(proc := start(tiny_model, out, log))
    assert wait_until(lambda: logged_lines(out) >= 2, proc, "step 2"), log.read_text()[-3000:]
    time.sleep(rng.uniform(0.0, 1.5))
    assert proc.poll() is None, "the run ended before the kill"
    kill(proc)
    saved.append(assert_latest_checkpoint_loads(out))
    assert saved[-1] >= 1
    # 2. during a weight sync, with interrupted requests waiting to continue on the new weights
    log, marker = tmp_path / "run1.log", tmp_path / "held.json"
    procs.append(proc := start(tiny_model, out, log, marker=marker))
    assert wait_until(marker.exists, proc, "a held sync", timeout_s=400), log.read_text()[-3000:]
    kill(proc)
    held = json.loads(marker.read_text())
    assert held["suspended"] > 0 and held["version"] > saved[-1]
    saved.append(assert_latest_checkpoint_loads(out))
    assert saved == sorted(saved)  # a kill never loses a complete checkpoint
    log = tmp_path / "final.log"
    procs.append(proc := start(tiny_model, out, log))
    assert proc.wait(timeout=600) == 0, log.read_text()[-3000:]

    # every step once, in metrics.jsonl and in TensorBoard
    rows = metrics(out)
    assert [r["step"] for r in rows] == list(range(1, MAX_STEPS + 1))
    for key in ("rollout/kept_trajectories", "rollout/outstanding_groups", "losses/policy_loss"):
        board = tensorboard_scalars(out / "tensorboard", key)
        assert [s for s, _ in board] == list(range(1, MAX_STEPS + 1)), key
        assert [v for _, v in board] == pytest.approx([r[key] for r in rows], rel=1e-6), key
    # every step trains a full batch; the group ledger adds up across the kills
    outstanding = 0
    for r in rows:
        assert r["rollout/kept_trajectories"] == GROUPS_PER_STEP * GROUP_SIZE, r["step"]
        assert r["rollout/collected_groups"] == GROUPS_PER_STEP, r["step"]
        assert r["rollout/replayed_groups"] in (0, outstanding), r["step"]  # what its checkpoint owed
        assert r["rollout/outstanding_groups"] == (
            outstanding + r["rollout/dispatched_groups"] - r["rollout/collected_groups"] - r["rollout/failed_groups"]
        ), r["step"]
        outstanding = r["rollout/outstanding_groups"]
    assert any(r["rollout/replayed_groups"] > 0 for r in rows)  # a resume played owed groups again
    assert sum(r["rollout/interrupted_requests"] for r in rows) > 0
    # each group identity trained once; every identity of a step dispatched is trained or still owed
    trained = [
        json.loads(line)["traj_group_id"]
        for step in range(1, MAX_STEPS + 1)
        for line in (out / "traces" / f"step_{step}.jsonl").read_text().splitlines()
    ]
    groups = sorted(set(trained))
    assert all(trained.count(g) <= GROUP_SIZE for g in groups)  # none trained twice (in two steps)
    assert len(trained) == sum(r["rollout/kept_trajectories"] for r in rows)
    # the identities dispatched (steps x groups, plus a replacement per failed group), less the
    # failed ones, less those owed at the end: all trained
    assert len(groups) == MAX_STEPS * GROUPS_PER_STEP - outstanding
    if sum(r["rollout/failed_groups"] for r in rows) == 0:  # else replacements take indices past GROUPS_PER_STEP
        assert set(groups) <= {f"train-{s}-{j}" for s in range(1, MAX_STEPS + 1) for j in range(GROUPS_PER_STEP)}
    assert assert_latest_checkpoint_loads(out) == MAX_STEPS
