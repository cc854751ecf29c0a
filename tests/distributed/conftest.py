"""Fixtures shared by the engine tests."""

from __future__ import annotations

import pytest

from tests.conftest import save_tiny_llama


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """A 2-layer Llama with grouped-query attention (4 heads, 2 KV heads), vocabulary
    `VOCAB`, random weights from seed 0, saved as an HF dir."""
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_llama"), seed=0)
