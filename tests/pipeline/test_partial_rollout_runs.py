"""Partial rollout through the whole pipeline (real Ray actors, the real tiny model, the CLI).

- Async training at staleness 0 is synchronous training: the same seed gives the same losses, step
  for step, with partial rollout on (nothing may run ahead of a weight sync it cannot survive).
- On a long-tailed workload (benchmarks/configs/long_tail_frozen_lake.yaml: answers of 32 and 256
  tokens, a decode step stretched to 5 ms so that syncs land mid-generation), "continue"
  interrupts requests at every sync and throws no token away, and the tokens of one batch come
  from two versions; "abort" throws tokens away; both still log every step and train full batches.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.ray

SMALL = [
    "rollout_batch_size=8",
    "train_env_manager.num_env_groups=4",
    "train_env_manager.group_size=4",
    "eval_steps=0",
    "save_steps=0",
    "actor_train.training_args.per_device_train_batch_size=8",
    "actor_train.training_args.gradient_accumulation_steps=1",
]
LOSSES = ("losses/policy_loss", "losses/approx_kl", "losses/entropy", "losses/clipfrac", "actor/grad_norm")


def run(config_path: str, config_name: str, tiny_model, out: Path, *extra: str) -> list[dict]:
    cmd = [
        sys.executable,
        "examples/start_agentic_pipeline.py",
        "--config_path",
        config_path,
        "--config_name",
        config_name,
        f"pretrain={tiny_model}",
        f"output_dir={out}",
        *extra,
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_async_at_staleness_0_trains_what_sync_trains(tiny_model, tmp_path):
    steps = 20
    base = ("frozen_lake", "agent_val_frozen_lake", tiny_model)
    sync = run(*base, tmp_path / "sync", f"max_steps={steps}", *SMALL)
    async_0 = run(
        *base,
        tmp_path / "async0",
        f"max_steps={steps}",
        *SMALL,
        "async_generation_ratio=1",
        "+async_max_staleness=0",
        "+partial_rollout=true",
    )
    assert [r["step"] for r in sync] == [r["step"] for r in async_0] == list(range(1, steps + 1))
    for a, b in zip(sync, async_0, strict=True):
        for key in LOSSES:
            assert b[key] == pytest.approx(a[key], abs=1e-6), (a["step"], key)
        assert (
            b["train/success"] == a["train/success"] and b["rollout/generated_tokens"] == a["rollout/generated_tokens"]
        )
        assert b["rollout/staleness_max"] == 0 and b["rollout/stale_dropped_groups"] == 0


LONG_TAIL = [
    "max_steps=4",
    "async_generation_ratio=1",
    "rollout_batch_size=8",
    "train_env_manager.group_size=4",
    "train_env_manager.num_env_groups=4",
    "train_env_manager.tags=[LongLake,ShortLake]",
    "train_env_manager.num_groups_partition=[2,2]",
    "custom_envs.LongLake.max_steps=2",
    "actor_train.training_args.per_device_train_batch_size=16",
    "actor_train.training_args.gradient_accumulation_steps=1",
    "+actor_infer.system_envs.ROLL_DECODE_DELAY_MS='5'",
]


# abort (ROLL's mode, kept for the comparison) runs in the lane: the engine-level tests cover it in
# .ci/run (tests/distributed/test_partial_rollout.py), and the gate keeps the continue run
@pytest.mark.parametrize("mode", ["continue", pytest.param("abort", marks=pytest.mark.lane)])
def test_a_long_tailed_async_run_interrupts_at_each_sync(tiny_model, tmp_path, mode):
    rows = run(
        "benchmarks/configs",
        "long_tail_frozen_lake",
        tiny_model,
        tmp_path / mode,
        *LONG_TAIL,
        f"partial_rollout={mode}",
    )
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["rollout/kept_trajectories"] == 8 and r["rollout/dropped_trajectories"] == 0 for r in rows)
    interrupted = sum(r["rollout/interrupted_requests"] for r in rows)
    discarded = sum(r["rollout/discarded_tokens"] for r in rows)
    assert interrupted > 0  # the premise: syncs landed mid-generation
    if mode == "continue":
        assert discarded == 0 and sum(r["rollout/recomputed_tokens"] for r in rows) > 0
        # some batch trained tokens of two versions, some trajectory (or turn) spans two
        assert any(r.get("rollout/tokens_by_version_lag/1", 0) > 0 for r in rows[1:])
        assert any(r["rollout/mixed_version_trajectories"] > 0 for r in rows[1:])
    else:
        assert discarded > 0 and sum(r["rollout/recomputed_tokens"] for r in rows) == 0
    for r in rows:
        assert r["rollout/staleness_max"] <= 1  # k = 1: no token older than one version is trained


@pytest.mark.timeout(900)
def test_an_engine_killed_while_holding_continued_requests_loses_no_trajectory_silently(tiny_model, tmp_path):
    """kill -9 of the inference worker right after a step is logged: the sync just before it
    interrupted the requests in flight, and their continuations (and the part each generated
    before the sync) live in that process. Ray restarts the engine with the last weights; every
    trajectory that was being played is either finished or counted as dropped with its cause,
    every step is logged once, and every step trains a full batch."""
    from tests.pipeline.test_worker_restart import kill_one, start_run, steps, wait_for_step

    out, log = tmp_path / "run", tmp_path / "run.log"
    args = [
        "--config_path",
        "benchmarks/configs",
        "--config_name",
        "long_tail_frozen_lake",
        *LONG_TAIL[1:],
        "max_steps=6",
        "partial_rollout=true",
    ]
    proc = start_run(tiny_model, out, log, args)
    try:
        assert wait_for_step(out, 2, proc), log.read_text()[-3000:]
        kill_one(proc, "ray::InferenceWorker")
        assert proc.wait(timeout=600) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    rows, text = steps(out), log.read_text()
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert all(r["rollout/kept_trajectories"] == 8 for r in rows)
    dropped = sum(r["rollout/dropped_trajectories"] for r in rows)
    assert dropped == text.count(": dropped a trajectory: ") and dropped > 0  # the engine's death cost episodes
    assert "inference worker restarted: serving the weights of version" in text
    assert sum(r["rollout/interrupted_requests"] for r in rows) > 0
