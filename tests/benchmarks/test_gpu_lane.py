"""The GPU lane (benchmarks/gpu/gpu_lane.py, `.ci/run_gpu`) on CPU: its smoke run drives the same code
as the GPU run (strategies, variants, skips, the record), its FLOP count is checked by hand, and
its CUDA-only branches are reached with CUDA calls stood in for, since no GPU is here."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest
import torch

from benchmarks.gpu import gpu_lane

REPO = Path(__file__).resolve().parents[2]


def test_training_flops_of_qwen2_half_b_by_hand():
    """Qwen2-0.5B: per layer q,o 2*896^2, k,v 2*896*128, MLP 3*896*4864 = 14,909,440; 24 layers +
    the tied output layer 151936*896 = 493,961,216 matmul parameters (the model's 494M); at 1024
    tokens 6 * that + 12 * 24 * 896 * 1024."""
    from transformers import Qwen2Config

    config = Qwen2Config(**gpu_lane.SIZES["0.5b"])
    assert gpu_lane.train_flops_per_token(config, 1024) == 6 * 493_961_216 + 12 * 24 * 896 * 1024


def test_cuda_branches_with_cuda_stood_in(monkeypatch):
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device: synced.append(device))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cuda = torch.device("cuda", 0)
    assert gpu_lane.timed(lambda: None, cuda) >= 0 and synced == [cuda, cuda]
    settings = gpu_lane.lane_settings(smoke=False, steps=None)
    assert (settings.size, settings.dtype, settings.device, settings.seq_len) == ("0.5b", torch.bfloat16, cuda, 1024)
    has_flash = importlib.util.find_spec("flash_attn") is not None
    assert gpu_lane.attention_implementation(cuda) == ("flash_attention_2" if has_flash else "sdpa")
    assert gpu_lane.attention_implementation(torch.device("cpu")) == "sdpa"


def test_without_cuda_the_wrapper_says_what_it_skipped():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the wrapper would run the whole lane")
    out = subprocess.run(["bash", ".ci/run_gpu"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("no CUDA device: skipped")


def test_smoke_run_trains_every_variant_or_says_why_not(tmp_path):
    """torch and megatron (the other strategies run the same `train_one`; CI time), each plain, with
    gradient checkpointing, with LoRA and compiled (megatron: skipped, saying why), then hf
    generation; the record holds finite figures, the commit and the optimizer's kernel."""
    pytest.importorskip("megatron.core")
    pytest.importorskip("peft")
    out = tmp_path / "smoke.json"
    assert gpu_lane.main(["--smoke", "--strategies", "torch,megatron", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["dtype"] == "float32" and record["failures"] == [] and record["matmul_peak_tflops"] > 0
    runs = {(r["strategy"], r["variant"]): r for r in record["training"]}
    assert len(runs) == 8
    assert runs.pop(("megatron", "compile")) == {
        "strategy": "megatron",
        "variant": "compile",
        "skipped": "torch_compile is an option of the torch and fsdp2 strategies",
    }
    for key, run in runs.items():
        assert run["tokens_per_s"] > 0 and 0 < run["mfu"] and run["grad_norms_finite"], key
        assert run["fused_adamw"] is False, key  # CPU: torch's default kernel
    assert len(record["commit"]) == 40
    assert record["generation"]["generated_tokens"] == 2 * 4 and record["generation"]["tokens_per_s"] > 0


def test_each_entry_is_saved_as_it_comes_and_the_sizes_are_options(tmp_path, monkeypatch):
    """A lane stopped part way (a device call's time limit) keeps what it measured: the record is
    written after every entry. `--batch` / `--seq_len` set the shape, `--no_generation` skips
    generation."""
    seen = []
    real_train_one = gpu_lane.train_one

    def train_one(settings, strategy, variant, peak):
        out = tmp_path / "partial.json"
        seen.append(json.loads(out.read_text())["training"] if out.exists() else None)
        return real_train_one(settings, strategy, variant, peak)

    monkeypatch.setattr(gpu_lane, "train_one", train_one)
    out = tmp_path / "partial.json"
    assert (
        gpu_lane.main(
            [
                "--smoke",
                "--strategies",
                "torch",
                "--variants",
                "plain,lora",
                "--batch",
                "3",
                "--seq_len",
                "5",
                "--no_generation",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert seen[0] is None and [r["variant"] for r in seen[1]] == ["plain"]
    record = json.loads(out.read_text())
    assert (record["batch"], record["seq_len"], record["generation"]) == (3, 5, None)
    assert [r["variant"] for r in record["training"]] == ["plain", "lora"]


def test_a_second_record_of_the_day_does_not_overwrite_the_first(tmp_path):
    assert gpu_lane.new_record_path(tmp_path, "2026-11-26") == tmp_path / "gpu-2026-11-26.json"
    (tmp_path / "gpu-2026-11-26.json").write_text("{}")
    assert gpu_lane.new_record_path(tmp_path, "2026-11-26") == tmp_path / "gpu-2026-11-26-2.json"
    (tmp_path / "gpu-2026-11-26-2.json").write_text("{}")
    assert gpu_lane.new_record_path(tmp_path, "2026-11-26") == tmp_path / "gpu-2026-11-26-3.json"
