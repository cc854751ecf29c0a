"""The Sokoban and WebShop examples train the tiny model for a few steps through the CLI, exactly
as their run_*.sh scripts do (smaller batches), and save their validation episodes. Each also
trains with a sharded engine, as a user picks one from the command line: Sokoban with DeepSpeed
ZeRO-3, WebShop with FSDP2 (both on CPU, gloo) and two inference replicas; the FrozenLake runs
elsewhere use `torch` and one replica."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.ray

SMALL = [
    "max_steps=2",
    "eval_steps=2",
    "save_steps=2",
    "rollout_batch_size=8",
    "train_env_manager.num_env_groups=2",
    "train_env_manager.group_size=4",
    "val_batch_size=2",
    "val_env_manager.num_env_groups=2",
    "actor_train.training_args.per_device_train_batch_size=4",
    "actor_train.training_args.gradient_accumulation_steps=1",
]


ENGINE = {
    "deepspeed": [
        "actor_train.strategy_args.strategy_name=deepspeed_train",
        "+actor_train.strategy_args.strategy_config={zero_optimization: {stage: 3}}",
    ],
    # and two inference replicas behind the env workers' gateway, each synced after every step
    "fsdp2": [
        "actor_train.strategy_args.strategy_name=fsdp2",
        "+actor_infer.strategy_args.strategy_config.num_replicas=2",
    ],
}


@pytest.mark.parametrize(
    ("example", "env_metric", "frame_text", "engine"),
    [
        ("sokoban", "train/env/boxes_on_target", "P", "deepspeed"),  # a grid with the player
        ("webshop", "train/env/purchased", "[Search]", "fsdp2"),  # WebShop's first page, as text
    ],
)
def test_example_trains_through_the_cli(example, env_metric, frame_text, engine, tmp_path):
    from roll.pipeline.tiny_model import main as build

    model = build(["--preset", example, "--output_dir", str(tmp_path / "model")])
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "examples/start_agentic_pipeline.py",
        "--config_path",
        example,
        "--config_name",
        f"agent_val_{example}",
        f"pretrain={model}",
        f"output_dir={out}",
        f"render_save_dir={out / 'frames'}",
        *SMALL,
        *ENGINE[engine],
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:
        assert r["rollout/dropped_trajectories"] == 0 and r["rollout/kept_trajectories"] == 8
        assert env_metric in r and "losses/policy_loss" in r
    assert "val/success" in rows[0] and "val/success" in rows[2]
    episodes = sorted((out / "frames" / "step_2").glob("*.txt"))
    assert len(episodes) == 2 and frame_text in episodes[0].read_text()
    checkpoint = out / "checkpoints" / "step_2"
    assert (checkpoint / "config.json").is_file()
    assert (checkpoint / "deepspeed").is_dir() == (engine == "deepspeed")  # ZeRO's own optimizer files
    assert AutoModelForCausalLM.from_pretrained(checkpoint).num_parameters() > 0
