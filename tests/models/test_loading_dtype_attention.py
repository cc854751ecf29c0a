"""dtype and attention are applied when a model is loaded (roll.models.loading), with one warning
line where the device cannot run what the config asks."""

from __future__ import annotations

import logging

import pytest
import torch

from roll.models.loading import load_causal_lm, load_value_model, resolve_attention
from tests.conftest import save_tiny_llama


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> str:
    return save_tiny_llama(tmp_path_factory.mktemp("llama"), layers=1)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "roll"]


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_weights_in_the_configured_dtype_and_attention(llama_dir, attention, caplog):
    model = load_causal_lm(llama_dir, dtype="bfloat16", attn_implementation=attention)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.config._attn_implementation == attention
    critic = load_value_model(llama_dir, dtype="bfloat16", seed=0, attn_implementation=attention)
    assert {p.dtype for p in critic.parameters()} == {torch.bfloat16}
    assert critic.config._attn_implementation == attention
    assert _warnings(caplog) == []


def test_fp16_training_on_cpu_falls_back_to_fp32_with_one_line(llama_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="roll"):
        model = load_causal_lm(llama_dir, dtype="float16", device="cpu")
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert _warnings(caplog) == ["dtype float16 cannot train on CPU; falling back to float32 (use bfloat16 or float32)"]
    frozen = load_causal_lm(llama_dir, dtype="float16", device="cpu", training=False)  # inference keeps it
    assert {p.dtype for p in frozen.parameters()} == {torch.float16}


@pytest.mark.parametrize("name", ["fa2", "flash_attn", "flash_attention_2"])
def test_flash_attention_without_gpu_is_sdpa_with_one_line(llama_dir, name, caplog):
    with caplog.at_level(logging.WARNING, logger="roll"):
        model = load_causal_lm(llama_dir, attn_implementation=name, device="cpu")
    assert model.config._attn_implementation == "sdpa"
    assert _warnings(caplog) == [f"attn_implementation {name!r}: flash attention needs a CUDA GPU; using sdpa"]
    assert resolve_attention("eager") == "eager" and resolve_attention(None) is None
