"""The math agent example trains the tiny model for two steps through the CLI, as its run_*.sh
does (smaller batches): dataset rows played by the tool agent with a calculator, math-verify
rewards, GRPO, rollout traces; validation plays the same questions with the LangGraph agent
(`math_graph`: agent node <-> ToolNode), so both kinds of agent loop run through the real pipeline.
And a bad dataset path fails at config load, before Ray starts."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

REPO = Path(__file__).resolve().parents[2]
SMALL = [
    "max_steps=2",
    "eval_steps=2",
    "save_steps=2",
    "rollout_batch_size=8",
    "train_env_manager.num_env_groups=2",
    "val_batch_size=2",
    "val_env_manager.num_env_groups=2",
    "actor_train.training_args.per_device_train_batch_size=8",
    "actor_train.training_args.gradient_accumulation_steps=1",
]


def cli(*args: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "examples/start_agentic_pipeline.py",
        "--config_path",
        "math_agent",
        "--config_name",
        "agent_val_math",
        *args,
    ]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from roll.pipeline.tiny_model import main as build

    return build(["--preset", "math", "--output_dir", str(tmp_path_factory.mktemp("m") / "model")])


@pytest.mark.ray
def test_math_agent_trains_through_the_cli(model, tmp_path):
    out = tmp_path / "run"
    proc = cli(
        f"pretrain={model}",
        f"output_dir={out}",
        *SMALL,
        "custom_envs.MathVal.env_config.dataset=examples/math_agent/data/val_graph_agent.jsonl",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:
        assert r["rollout/dropped_trajectories"] == 0 and r["rollout/kept_trajectories"] == 8
        for key in ("train/env/tool_calls", "train/env/malformed_tool_calls", "losses/policy_loss", "train/success"):
            assert key in r, key
    assert "val/env/tool_calls" in rows[0] and "val/success" in rows[2]
    assert "val/env/retemplated_turns" in rows[0]  # a metric only the LangGraph agent reports
    traces = [json.loads(line) for line in (out / "traces" / "step_2.jsonl").read_text().splitlines()]
    assert len(traces) == 8 and len({t["env_seed"] for t in traces}) == 2  # 2 questions x 4 answers
    assert all(t["turns"][0]["role"] == "context" and "calculator" in t["turns"][0]["text"] for t in traces)
    assert (out / "traces" / "val_step_0.jsonl").is_file()
    checkpoint = out / "checkpoints" / "step_2"
    assert AutoModelForCausalLM.from_pretrained(checkpoint).num_parameters() > 0


def test_a_missing_dataset_fails_at_config_load(model):
    proc = cli(f"pretrain={model}", "custom_envs.MathTrain.env_config.dataset=/no/rows.jsonl")
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .endswith("custom_envs.MathTrain.env_config.dataset: '/no/rows.jsonl' does not exist")
    )
