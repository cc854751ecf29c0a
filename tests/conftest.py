"""What tests across folders share: the tiny random Llama, and the `hf` engine on a tiny VL dir.

`tiny_llama_config(layers=2)` is the shape the engine and worker tests train (2 layers, hidden 32,
4 heads and 2 KV heads: grouped-query attention, vocabulary 32); `layers=1` the smallest one
(hidden 16, 2 heads, 1 KV head) for tests that only need some model. Keyword overrides change any
field. `tiny_llama(seed)` builds it with random weights drawn after `torch.manual_seed(seed)`, and
`save_tiny_llama(path, seed)` saves that as an HF dir. Test files import them (`from tests.conftest
import tiny_llama`). `vl_engine(vl_dir)` is the `hf` engine as the inference worker builds it on a
VL model (vision marker ids never sampled); transformers is imported only when one is called, so tests that need no
model do not pay for it. `run_example(out, *args)` runs `examples/start_agentic_pipeline.py` with
`output_dir=out` in a subprocess, as a user does, and returns its output and metrics rows. The
`tiny_model` fixture is the README example's model (the `frozen_lake` preset), built once a session;
tests read it as `pretrain` and never write into it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

TINY_LLAMA_VOCAB = 32
"""Vocabulary size of both shapes unless overridden."""
_SHAPES = {
    2: dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    ),
    1: dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1),
}


def tiny_llama_config(layers: int = 2, **overrides):
    """A `LlamaConfig` of the 2-layer or the 1-layer shape (vocabulary 32), fields `overrides`d."""
    from transformers import LlamaConfig

    return LlamaConfig(**({"vocab_size": TINY_LLAMA_VOCAB} | _SHAPES[layers] | overrides))


def tiny_llama(seed: int = 0, layers: int = 2, *, value_head: bool = False, **overrides):
    """The tiny Llama with random weights from `seed`: a causal LM, or with `value_head` a
    one-label token classifier (a critic's value model, in eval mode: no head dropout)."""
    import torch
    from transformers import LlamaForCausalLM, LlamaForTokenClassification

    torch.manual_seed(seed)
    if value_head:
        return LlamaForTokenClassification(tiny_llama_config(layers, num_labels=1, **overrides)).eval()
    return LlamaForCausalLM(tiny_llama_config(layers, **overrides))


def save_tiny_llama(path: str | Path, seed: int = 0, layers: int = 2, **overrides) -> str:
    """`tiny_llama(seed, layers, **overrides)` saved as an HF dir at `path` (weights only, no
    tokenizer); returns the path."""
    tiny_llama(seed, layers, **overrides).save_pretrained(path)
    return str(path)


def vl_engine(vl_dir: str, **kwargs):
    """`HFInferStrategy` on the VL model at `vl_dir`, its vision marker ids suppressed as the
    inference worker does; `kwargs` go to the strategy."""
    from roll.distributed.strategies.hf.infer import HFInferStrategy
    from roll.models.loading import load_policy, load_processor, vision_token_ids

    model = load_policy(vl_dir, training=False)
    tok = load_processor(vl_dir).tokenizer
    return HFInferStrategy(
        model, tok.pad_token_id, [tok.eos_token_id], suppressed_token_ids=vision_token_ids(model.config), **kwargs
    )


def run_example(out: Path, *args: str, timeout: float = 900) -> tuple[str, list[dict]]:
    """`python examples/start_agentic_pipeline.py *args output_dir=out`, which must exit 0 (else its
    stderr's tail is the failure); its stdout and stderr together, and its metrics.jsonl rows."""
    cmd = [sys.executable, "examples/start_agentic_pipeline.py", *args, f"output_dir={out}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    return proc.stdout + proc.stderr, rows


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """The README example's tiny model dir (`python -m roll.pipeline.tiny_model --preset frozen_lake`)."""
    from roll.pipeline.tiny_model import main as build

    return build(["--preset", "frozen_lake", "--output_dir", str(tmp_path_factory.mktemp("m") / "tiny")])
