"""ROLL's LoRA example (our copy in ROLL's dialect: tests/configs/roll_dialect/runs/sokoban_lora.yaml,
megatron_train with `lora_target: all-linear`) trains the tiny model for 2 steps through the CLI
with `+profile=cpu_smoke` and rank 4: only the adapters train, the saved checkpoint is a merged
HF model that moved exactly in the adapted layers, and without the `lora_*` keys every parameter
trains."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

REPO = Path(__file__).resolve().parents[2]
RUNS = REPO / "tests" / "configs" / "roll_dialect" / "runs"
RANK = 4
pytestmark = pytest.mark.ray

# The tiny random model fails every action (3 x format_penalty -0.15 = -0.45 per episode), so all
# episodes of a group score the same: GRPO's advantages and mean_std-normalised rewards are then 0
# and nothing would move. REINFORCE on the raw score without whitening gives advantage -0.45
# (advantage_clip: -0.2) on every generated token: a non-zero gradient, deterministically.
NONZERO_GRADIENT = ["adv_estimator=reinforce", "reward_normalization.method=identity", "whiten_advantages=false"]
# ROLL's file puts the LoRA keys under model_args of actor_train and actor_infer
LORA_KEYS = [
    f"{role}.model_args.{key}"
    for role in ("actor_train", "actor_infer")
    for key in ("lora_rank", "lora_alpha", "lora_target")
]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from roll.pipeline.tiny_model import main as build

    return Path(build(["--preset", "sokoban", "--output_dir", str(tmp_path_factory.mktemp("m") / "tiny")]))


def _train(tiny_model: Path, out: Path, *overrides: str) -> tuple[list[dict], Path]:
    """Two steps of sokoban_lora through the CLI: (metrics.jsonl rows, the last checkpoint dir)."""
    cmd = [
        sys.executable,
        "examples/start_agentic_pipeline.py",
        "--config_path",
        str(RUNS),
        "--config_name",
        "sokoban_lora",
        "+profile=cpu_smoke",
        "max_steps=2",
        "eval_steps=0",
        f"pretrain={tiny_model}",
        f"reward_pretrain={tiny_model}",
        f"output_dir={out}/out",
        f"logging_dir={out}/logs",
        f"render_save_dir={out}/render",
        f"tracker_kwargs.log_dir={out}/tb",
        f"checkpoint_config.output_dir={out}/ckpt",
        *NONZERO_GRADIENT,
        *overrides,
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    # warmup_steps: 10 gives step 1 lr 0; step 2 is a real update with a real gradient
    assert rows[1]["actor/lr"] > 0 and rows[1]["actor/grad_norm"] > 0
    return rows, out / "ckpt" / "checkpoints" / "step_2"


@pytest.fixture(scope="module")
def lora_run(tiny_model, tmp_path_factory):
    return _train(
        tiny_model,
        tmp_path_factory.mktemp("lora"),
        *(f"{role}.model_args.lora_rank={RANK}" for role in ("actor_train", "actor_infer")),
    )


def _param_counts(rows: list[dict]) -> tuple[float, float]:
    logged = [r for r in rows if "model/trainable_params" in r]
    assert len(logged) == 1 and "model/total_params" in logged[0]  # once per run
    return logged[0]["model/trainable_params"], logged[0]["model/total_params"]


def _megatron_adapter_params(model_dir: Path, rank: int) -> int:
    """Adapter parameters of `all-linear` LoRA on megatron, by hand: r * (in + out) for each of a
    decoder layer's four fused linears (roll.distributed.strategies.megatron.lora): qkv, the
    attention output, gate+up (fc1) and down (fc2)."""
    c = AutoConfig.from_pretrained(model_dir)
    h, inter, hd = c.hidden_size, c.intermediate_size, c.head_dim
    q, kv = c.num_attention_heads * hd, c.num_key_value_heads * hd
    fused = [(h, q + 2 * kv), (q, h), (h, 2 * inter), (inter, h)]
    return c.num_hidden_layers * sum(rank * (fan_in + fan_out) for fan_in, fan_out in fused)


def _start(tiny_model: Path) -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()


def test_lora_trains_only_the_adapters(lora_run, tiny_model):
    trainable, total = _param_counts(lora_run[0])
    base = AutoModelForCausalLM.from_pretrained(tiny_model).num_parameters()
    adapters = _megatron_adapter_params(tiny_model, RANK)
    assert adapters == 20480  # 2 layers x 4 x (128+384 + 128+128 + 128+1024 + 512+128)
    assert (trainable, total) == (adapters, base + adapters)
    assert trainable / total == pytest.approx(20480 / 557056)  # 0.037


def test_lora_checkpoint_is_merged_hf_model_that_moved_in_the_adapted_layers(lora_run, tiny_model):
    start = _start(tiny_model)
    saved = AutoModelForCausalLM.from_pretrained(lora_run[1]).state_dict()
    assert saved.keys() == start.keys()
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    # all-linear: every Linear of the decoder layers; never the output head (tied to the embeddings)
    adapted = {
        f"{name}.weight"
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and name.startswith("model.layers.")
    }
    assert len(adapted) == 2 * 7  # q, k, v, o, gate, up, down in each of 2 layers
    changed = {key for key in start if not torch.equal(saved[key], start[key])}
    assert changed == adapted  # embeddings, norms and lm_head are bit-identical to the start


def test_without_lora_keys_every_parameter_trains(tiny_model, tmp_path):
    rows, checkpoint = _train(tiny_model, tmp_path, *(f"~{key}" for key in LORA_KEYS))
    trainable, total = _param_counts(rows)
    assert trainable == total == AutoModelForCausalLM.from_pretrained(tiny_model).num_parameters()
    start = _start(tiny_model)
    saved = AutoModelForCausalLM.from_pretrained(checkpoint).state_dict()
    assert {key for key in start if not torch.equal(saved[key], start[key])} == set(start)  # norms too
