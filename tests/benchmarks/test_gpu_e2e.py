"""The GPU end-to-end lane (benchmarks/gpu/gpu_e2e.py, `.ci/run_gpu_e2e`) on CPU: what it reads from a
run's metrics is checked against hand-written lines, a run past its budget is stopped and still
summarised (a stand-in CLI that only writes metrics), and its smoke run drives the real pipeline
through every part (the `lane` marker: several Ray runs, too slow for .ci/run)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from benchmarks.gpu import gpu_e2e
from benchmarks.gpu import gpu_e2e_summary as summary

REPO = Path(__file__).resolve().parents[2]


def write_metrics(directory: Path, rows: list[dict]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


ROWS = [
    {"step": 0, "val/success": 0.1, "time/validate_s": 0.5},
    {"step": 1, "time/step_s": 2.0, "time/rollout_s": 1.0, "time/sync_s": 0.2, "rollout/generated_tokens": 100.0},
    {
        **{"step": 2, "time/step_s": 1.0, "time/rollout_s": 0.5, "time/sync_s": 0.1, "time/offload_s": 0.05},
        **{"rollout/generated_tokens": 200.0, "val/success": 0.95, "time/validate_s": 0.25},
        **{"rollout/engine_calls": 6.0, "rollout/engine_requests": 900.0},
        **{"memory/actor_train_peak_gib": 1.5, "sync/cuda_ipc": 1.0},
        **{"time/idle/actor_train": 0.4, "time/idle/actor_infer": 0.2, "time/idle_fraction": 0.3},
    },
    {
        **{"step": 3, "time/step_s": 3.0, "time/rollout_s": 1.5, "time/sync_s": 0.3, "time/offload_s": 0.15},
        **{"rollout/generated_tokens": 100.0, "memory/actor_train_peak_gib": 1.0, "sync/cuda_ipc": 1.0},
        **{"rollout/engine_calls": 8.0, "rollout/engine_requests": 1100.0},
        **{"time/idle/actor_train": 0.6, "time/idle/actor_infer": 0.4, "time/idle_fraction": 0.5},
    },
]


def test_summary_of_a_run_by_hand(tmp_path):
    """Step 1 is the warm-up (left out of the per-step figures); val 0.95 at step 2 after
    0.5 + 2.0 + 1.0 + 0.25 s of the pipeline's own time; tokens/s = 300 / (0.5 + 1.5)."""
    write_metrics(tmp_path, ROWS)
    run = {"status": "ok", "rc": 0, "wall_s": 30.0, "arrivals": {0: 10.0, 1: 12.0, 2: 13.5, 3: 16.0}}
    got = summary.summarize_run(tmp_path, run)
    assert got["steps_done"] == 3
    assert got["step_s"] == {"mean": 2.0, "median": 2.0, "min": 1.0, "max": 3.0, "n": 2}
    assert got["first_step_split_s"]["rollout"] == 1.0 and got["first_step_split_s"]["offload"] is None
    assert got["wall_step_s"] == 2.0  # gaps 13.5 - 12.0 and 16.0 - 13.5 after the warm-up step
    assert got["split_s"]["sync"] == 0.2 and got["split_s"]["offload"] == 0.1 and got["split_s"]["reload"] is None
    assert got["time_to_val_0_9_s"] == 3.75 and got["val_0_9_step"] == 2 and got["wall_to_val_0_9_s"] == 13.5
    assert got["generated_tokens_per_s"] == 150.0
    assert got["engine_calls"] == {"mean": 7.0, "median": 7.0, "min": 6.0, "max": 8.0, "n": 2}
    assert got["engine_requests"]["median"] == 1000.0
    assert got["peak_memory_gib"] == {"actor_train": 1.5}
    assert got["weight_sync_path"] == "cuda_ipc"
    assert got["val_success"] == {"0": 0.1, "2": 0.95}
    assert got["idle_s"] == {"actor_infer": 0.3, "actor_train": 0.5} and got["time_idle_fraction"] == 0.4


def test_summary_when_val_is_never_reached_and_metrics_are_missing(tmp_path):
    write_metrics(tmp_path, ROWS[:2])
    got = summary.summarize_run(tmp_path, {"status": "failed", "rc": 1, "wall_s": 1.0})
    assert got["time_to_val_0_9_s"] is None and got["weight_sync_path"] is None
    empty = summary.summarize_run(tmp_path / "none", {"status": "failed", "rc": 1, "wall_s": 1.0})
    assert empty["steps_done"] == 0 and empty["step_s"] == {} and empty["engine_calls"] == {}


def test_budgets_and_record_names(tmp_path, monkeypatch):
    assert gpu_e2e.parse_budgets("90") == dict.fromkeys(gpu_e2e.PARTS, 90.0)
    assert gpu_e2e.parse_budgets("a=240,c=60") == {**gpu_e2e.DEFAULT_BUDGETS_S, "a": 240.0, "c": 60.0}
    with pytest.raises(SystemExit, match="unknown part 'z'"):
        gpu_e2e.parse_budgets("z=1")
    monkeypatch.setattr(gpu_e2e, "REPO", tmp_path)
    first = gpu_e2e.record_path("2026-11-27")
    assert first.name == "gpu-e2e-2026-11-27.json"
    first.parent.mkdir(parents=True)
    first.write_text("{}")
    assert gpu_e2e.record_path("2026-11-27").name == "gpu-e2e-2026-11-27-2.json"


def test_the_gpu_runs_overrides_make_valid_configs(tmp_path):
    """What the lane asks of the GPU run, validated here (the GPU machine's time is short): every
    role on GPU 0, the reference built (the KL loss is on), part b in bf16 with Qwen2's shape."""
    from roll.configs import load_config

    lane = gpu_e2e.Lane(False, tmp_path, None, {"a": 200, "b": 5, "c": 3}, {}, None)
    model = tmp_path / "qwen"  # only its config.json's presence is checked here
    model.mkdir()
    (model / "config.json").write_text("{}")
    for overrides in (gpu_e2e.a_overrides(lane), gpu_e2e.b_overrides(lane, model), gpu_e2e.c_overrides(lane, 50)):
        cfg = load_config(str(REPO / "examples" / "frozen_lake"), "agent_val_frozen_lake", overrides)
        assert set(cfg.built_roles) == {"actor_train", "actor_infer", "reference"}
        assert all(worker.device_mapping == [0] for worker in cfg.built_roles.values())
    assert cfg.max_steps == 53 and cfg.resume_from_checkpoint is True and cfg.save_steps == 0
    example = load_config(str(REPO / "examples" / "frozen_lake"), "agent_val_frozen_lake", [f"pretrain={model}"])
    for roles in (
        cfg.built_roles,
        load_config(
            str(REPO / "examples" / "frozen_lake"), "agent_val_frozen_lake", gpu_e2e.a_overrides(lane)
        ).built_roles,
    ):
        args = roles["actor_train"].training_args  # one micro-batch of the example's PPO mini-batch
        assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (512, 1)
        assert args.mini_batch_size == example.actor_train.training_args.mini_batch_size == 512
        assert roles["actor_train"].infer_batch_size == roles["reference"].infer_batch_size == 512
    smoke = gpu_e2e.Lane(True, tmp_path, None, {"a": 2, "b": 2, "c": 1}, {}, None)
    assert not set(gpu_e2e.GPU_MICRO_BATCHES) & set(gpu_e2e.a_overrides(smoke))
    cfg = load_config(str(REPO / "examples" / "frozen_lake"), "agent_val_frozen_lake", gpu_e2e.b_overrides(lane, model))
    assert {str(w.model_args.dtype) for w in cfg.built_roles.values()} == {"bfloat16"}
    assert cfg.rollout_batch_size == 32 and cfg.custom_envs["FrozenLake"].max_tokens_per_step == 16


STAND_IN_CLI = """
import json, sys, time
out = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("output_dir=")][0]
import os; os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "metrics.jsonl"), "w") as f:
    f.write(json.dumps({"step": 1, "time/step_s": 0.1}) + "\\n")
time.sleep(120)
"""


def test_a_run_past_its_budget_is_stopped_and_summarised(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_e2e, "CLI", ["-c", STAND_IN_CLI])
    lane = gpu_e2e.Lane(True, tmp_path, tmp_path / "out", {}, {}, None)
    run = gpu_e2e.run_pipeline("x", ["pretrain=none"], tmp_path / "x", 3.0, lane)
    assert run["status"] == "stopped_at_budget" and run["rc"] != 0 and 1 in run["arrivals"]
    assert (tmp_path / "out" / "x" / "metrics.jsonl").exists() and (tmp_path / "out" / "x" / "run.log").exists()


def test_a_lane_told_to_stop_stops_its_run(tmp_path, monkeypatch):
    """SIGTERM to the lane (an outer `timeout`) reaches the run at once; its part is "interrupted"."""
    monkeypatch.setattr(gpu_e2e, "CLI", ["-c", STAND_IN_CLI])
    monkeypatch.setattr(gpu_e2e, "_TERMINATED", [15])
    lane = gpu_e2e.Lane(True, tmp_path, None, {}, {}, None)
    run = gpu_e2e.run_pipeline("x", [], tmp_path / "x", 600.0, lane)
    assert run["status"] == "interrupted" and run["rc"] != 0


def test_without_cuda_the_wrapper_says_what_it_skipped():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the wrapper would run the whole lane")
    out = subprocess.run(["bash", ".ci/run_gpu_e2e"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    assert out.stdout.startswith("no CUDA device: skipped")


@pytest.mark.ray
@pytest.mark.lane
def test_smoke_lane_runs_every_part_on_cpu(tmp_path):
    """a (actor, engine and reference; 2 steps, validated each step, a checkpoint at the end), b (a
    small Qwen2-shaped model), c (that checkpoint loaded on CPU, then resumed for one step); the
    record, marked smoke, lands only in --out and holds each part's figures."""
    out = tmp_path / "out"
    results = REPO / "benchmarks" / "results"
    records_before = sorted(results.glob("gpu-e2e-*"))
    assert gpu_e2e.main(["--smoke", "--out", str(out), "--work", str(tmp_path / "work")]) == 0
    record = json.loads((out / "record.json").read_text())
    assert record["smoke"] is True and record["commit"] and record["torch"] == torch.__version__
    a, b, c = (record["parts"][p] for p in "abc")
    assert a["status"] == "ok" and a["steps_done"] == 2 and set(a["val_success"]) == {"0", "1", "2"}
    assert a["step_s"]["n"] == 1 and a["split_s"]["train"] > 0 and a["split_s"]["offload"] == 0.0
    assert "+reference.strategy_args.strategy_name=hf_infer" in a["overrides"]
    assert b["status"] == "ok" and b["steps_done"] == 2 and b["generated_tokens_per_s"] > 0
    assert record["weight_sync_s"] == b["split_s"]["sync"] > 0
    assert c["status"] == "ok" and c["loaded_on_cpu"]["ok"] and c["resumed_from_step"] == 2 and c["steps_done"] == 3
    for part in "abc":
        assert {"run.log", "metrics.jsonl", "placement.json"} <= {f.name for f in (out / part).iterdir()}
    roles = {p["role"] for p in json.loads((out / "a" / "placement.json").read_text())["processes"]}
    assert {"actor_train", "actor_infer", "reference"} <= roles
    assert sorted(results.glob("gpu-e2e-*")) == records_before  # a smoke record stays in --out


APPENDING_CLI = """
import json, os, sys
out = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("output_dir=")][0]
os.makedirs(out, exist_ok=True)
path = os.path.join(out, "metrics.jsonl")
steps = [json.loads(line)["step"] for line in open(path)] if os.path.exists(path) else []
with open(path, "a") as f:
    f.write(json.dumps({"step": max(steps, default=0) + 1, "time/step_s": 0.1}) + "\\n")
"""


def test_a_fresh_part_starts_empty_and_a_resumed_one_notes_only_its_own_steps(tmp_path, monkeypatch):
    """A stale metrics.jsonl (an earlier lane's) is removed before a part runs; a run resumed in its
    part's dir (c) does not take the steps logged before it as arrivals."""
    monkeypatch.setattr(gpu_e2e, "CLI", ["-c", APPENDING_CLI])
    lane = gpu_e2e.Lane(True, tmp_path, None, {}, {}, None)
    write_metrics(tmp_path / "x", [{"step": 7, "time/step_s": 1.0}])
    run = gpu_e2e.run_pipeline("x", [], tmp_path / "x", 60.0, lane)
    assert run["status"] == "ok" and list(run["arrivals"]) == [1]
    resumed = gpu_e2e.run_pipeline("x", [], tmp_path / "x", 60.0, lane, fresh=False)
    assert resumed["status"] == "ok" and list(resumed["arrivals"]) == [2]
    assert [r["step"] for r in summary.read_metrics(tmp_path / "x")] == [1, 2]
