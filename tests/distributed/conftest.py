"""Fixtures shared by the engine tests."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 32


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """A 2-layer Llama with grouped-query attention (4 heads, 2 KV heads), vocabulary
    `VOCAB`, random weights from seed 0, saved as an HF dir."""
    path = tmp_path_factory.mktemp("tiny_llama")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    LlamaForCausalLM(config).save_pretrained(path)
    return str(path)
