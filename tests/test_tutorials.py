"""The tutorials are followed as written: each code block is the example's code as it is, and the
page's command trains (lane: a short run of it, smaller batches; the one-GPU page's CPU rehearsal)."""

import json
import os
import re
import shlex
import subprocess
import sys
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


ONE_GPU = REPO / "docs" / "tutorials" / "one_gpu.md"
ONE_GPU_CONFIG = REPO / "examples" / "real_model" / "agent_val_frozen_lake_one_gpu.yaml"
CHECKPOINT_IN_PAGE = '"output/frozen_lake_one_gpu/checkpoints/step_100"'


def commands(block: str) -> list[list[str]]:
    """A bash block's commands as argument lists (continued lines joined)."""
    return [shlex.split(line) for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def test_the_one_gpu_tutorials_config_is_the_examples_config(tmp_path):
    from roll.configs import load_config

    config = ONE_GPU_CONFIG.read_text()
    yaml = blocks(ONE_GPU, "yaml")
    assert len(yaml) == 6 and all(block in config for block in yaml)
    _, train, rehearse = (commands(block) for block in blocks(ONE_GPU, "bash"))
    # the CPU rehearsal is the GPU command with a built model and the documented switch, nothing else
    (gpu,), (build, cpu) = train, rehearse
    assert build[:3] == ["python", "-m", "roll.models.qwen2_layout"]
    assert [a for a in cpu if not a.startswith("pretrain=")] == [
        *(a for a in gpu if not a.startswith("pretrain=")),
        "+profile=cpu_smoke",
        "max_steps=2",
    ]
    assert CHECKPOINT_IN_PAGE in blocks(ONE_GPU, "python")[0]
    # the shipped config is the GPU one: every role on GPU 0 in bf16
    (tmp_path / "config.json").write_text("{}")
    cfg = load_config(str(ONE_GPU_CONFIG.parent), ONE_GPU_CONFIG.stem, [f"pretrain={tmp_path}"])
    for role in (cfg.actor_train, cfg.actor_infer, cfg.reference):
        assert role is not None and (role.device_mapping, role.model_args.dtype) == ([0], "bfloat16")


@pytest.mark.ray
@pytest.mark.lane
def test_the_one_gpu_tutorials_rehearsal_trains_a_qwen2_layout_on_a_cpu(tmp_path):
    """The page's CPU rehearsal as written (model and run in tmp_path): 2 steps, the checkpoint
    loads with the page's own snippet."""
    (build, command) = commands(blocks(ONE_GPU, "bash")[2])
    model, out = tmp_path / "qwen2-layout", tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    build = [sys.executable, *build[1:-1], str(model)]  # --output_dir's value is the last argument
    subprocess.run(build, cwd=REPO, env=env, check=True, capture_output=True, timeout=600)
    command = [sys.executable, *(f"pretrain={model}" if a.startswith("pretrain=") else a for a in command[1:])]
    small = [f"output_dir={out}", "eval_steps=2", "save_steps=2"]
    proc = subprocess.run([*command, *small], cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2] and "val/success" in rows[0] and "val/success" in rows[2]
    for r in rows[1:]:
        assert r["rollout/dropped_trajectories"] == 0 and r["rollout/kept_trajectories"] == 4
        assert r["rollout/generated_tokens"] > 0 and "losses/policy_loss" in r and "losses/kl_loss" in r
    assert any((out / "tensorboard").rglob("events.out.tfevents.*"))
    (snippet,) = blocks(ONE_GPU, "python")
    scope: dict = {}
    exec(snippet.replace(CHECKPOINT_IN_PAGE, repr(str(out / "checkpoints" / "step_2"))), scope)
    assert scope["model"].config.model_type == "qwen2" and scope["tokenizer"].eos_token == "<|im_end|>"
