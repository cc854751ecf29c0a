"""The tutorials are followed as written: each code block is the example's code as it is, and the
page's command trains (lane: a short run of it, smaller batches)."""

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
OPENAI_AGENT = REPO / "docs" / "tutorials" / "openai_agent.md"


def blocks(page: Path, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", page.read_text(), flags=re.S)


def test_the_openai_agent_tutorials_code_is_the_examples_code():
    source = (REPO / "examples" / "agent_proxy" / "openai_agent.py").read_text()
    python = blocks(OPENAI_AGENT, "python")
    assert len(python) == 2 and all(block in source for block in python)  # play, OpenAIAgentRunner
    (yaml,) = blocks(OPENAI_AGENT, "yaml")
    assert yaml in (REPO / "examples" / "agent_proxy" / "agent_val_frozen_lake_byo.yaml").read_text()


@pytest.mark.ray
@pytest.mark.lane
def test_the_openai_agent_tutorials_command_trains(tmp_path):
    from transformers import AutoModelForCausalLM

    (command,) = blocks(OPENAI_AGENT, "bash")
    out = tmp_path / "run"
    small = [
        f"output_dir={out}",
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
    proc = subprocess.run([*shlex.split(command), *small], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:
        assert r["rollout/dropped_trajectories"] == 0 and r["rollout/kept_trajectories"] == 8
        assert r["train/env/proxy/requests"] >= 1 and "losses/policy_loss" in r
    assert "val/success" in rows[2]
    AutoModelForCausalLM.from_pretrained(out / "checkpoints" / "step_2")
