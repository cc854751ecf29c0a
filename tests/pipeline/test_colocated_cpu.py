"""The colocated layout of a GPU run (actor_train, actor_infer and reference on one device, taking
turns through `roll.pipeline.phases.gpu_offload`) run end to end on CPU: every process is planned on a
stand-in device 0 and started on CPU (tests/lanes/colocated_cpu_run.py), so each phase offloads
and reloads the roles it does not need exactly as on a GPU, through real Ray actors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.ray


def test_three_roles_on_one_device_take_turns(tmp_path):
    from roll.pipeline.tiny_model import main as build

    model = build(["--preset", "frozen_lake", "--output_dir", str(tmp_path / "tiny")])
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "tests/lanes/colocated_cpu_run.py",
        *("--config_path", "frozen_lake", "--config_name", "agent_val_frozen_lake"),
        f"pretrain={model}",
        f"output_dir={out}",
        *("max_steps=2", "eval_steps=2", "save_steps=2", "+profile=cpu_smoke"),
        *("use_kl_loss=true", "kl_loss_coef=0.01", "+reference.strategy_args.strategy_name=hf_infer"),
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    placed = json.loads((out / "placement.json").read_text())["processes"]
    assert {p["role"] for p in placed if p["role"] in ("actor_train", "actor_infer", "reference")} == {
        "actor_train",
        "actor_infer",
        "reference",
    }
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for row in rows[1:]:  # every step offloads the engine for scoring and reloads it for the next rollout
        assert row["time/offload_s"] > 0 and row["time/reload_s"] > 0
        assert row["memory/actor_train_peak_gib"] == row["memory/reference_peak_gib"] == 0.0  # no CUDA here
        assert row["losses/kl_loss"] >= 0 and row["rollout/generated_tokens"] > 0
        assert row["sync/cuda_ipc"] == 1.0  # the device path (its envelope carries CPU tensors here)
    assert rows[2]["rollout/logprob_abs_diff"] < 1e-4  # the engine generated with the actor's step-1 weights
    assert "val/success" in rows[2] and (out / "checkpoints" / "step_2" / "config.json").exists()
