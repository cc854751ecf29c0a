"""Segment attention (roll.distributed.segment_attention): causal sdpa per packed segment gives the
numbers of the block-diagonal mask over the whole packed row (grouped-query attention included),
packed passes use it and leave the configured attention in place, and the passes it cannot serve
(gradient checkpointing, other attentions, a short sliding window) keep the mask."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from roll.distributed.segment_attention import (
    SEGMENT_SDPA,
    segment_kwargs,
    segment_sdpa_attention,
    uses_segment_attention,
)
from roll.distributed.sequence_packing import PackedSequences
from tests.conftest import tiny_llama

SEGMENTS = [3, 1, 5, 2]  # 11 tokens; one segment of a single token
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 8


def block_diagonal_causal(lengths: list[int]) -> torch.Tensor:
    """(1, 1, N, N) bool: query i sees key j when both are in one segment and j <= i."""
    segment = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    position = torch.arange(len(segment))
    allowed = (segment[:, None] == segment[None, :]) & (position[None, :] <= position[:, None])
    return allowed[None, None]


def test_segments_equal_the_block_diagonal_mask_with_grouped_query_heads():
    generator = torch.Generator().manual_seed(0)
    n = sum(SEGMENTS)
    query = torch.randn(1, HEADS, n, HEAD_DIM, generator=generator)
    key, value = (torch.randn(1, KV_HEADS, n, HEAD_DIM, generator=generator) for _ in range(2))
    module = SimpleNamespace(num_key_value_groups=HEADS // KV_HEADS, is_causal=True)
    offsets = segment_kwargs(torch.tensor(SEGMENTS))["cu_seq_lens_q"]
    assert offsets.tolist() == [0, 3, 4, 9, 11]

    got, _ = segment_sdpa_attention(module, query, key, value, None, scaling=0.3, cu_seq_lens_q=offsets)
    masked, _ = sdpa_attention_forward(module, query, key, value, block_diagonal_causal(SEGMENTS), scaling=0.3)
    assert got.shape == masked.shape == (1, n, HEADS, HEAD_DIM)
    assert_close(got, masked, rtol=1e-5, atol=1e-6)
    # by hand: the lone token of segment 1 (position 3) attends only to itself, so it is its value,
    # taken from KV head 0 for query heads 0 and 1, from KV head 1 for heads 2 and 3
    assert_close(got[0, 3], value[0, [0, 0, 1, 1], 3], rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="packed rows only"):
        segment_sdpa_attention(module, query, key, value, None)


def packed_inputs(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    mask = (torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]).long()
    ids = torch.randint(1, 32, mask.shape, generator=torch.Generator().manual_seed(seed))
    return ids * mask, mask


def logits_and_grads(runner, model, ids, mask) -> tuple[torch.Tensor, dict]:
    model.zero_grad()
    logits = runner(input_ids=ids, attention_mask=mask).logits
    (logits * mask[..., None]).square().sum().backward()
    return logits.detach() * mask[..., None], {name: p.grad.clone() for name, p in model.named_parameters()}


def test_packed_pass_runs_segments_and_matches_the_mask_path(monkeypatch):
    """The tiny Llama (4 heads, 2 KV heads): a packed pass calls the segment attention once per
    layer, keeps the configured sdpa, and gives the logits and gradients of the mask path."""
    model = tiny_llama(0)
    ids, mask = packed_inputs([9, 3, 6, 1, 7])
    calls = []
    counted = lambda *args, **kwargs: calls.append(1) or segment_sdpa_attention(*args, **kwargs)  # noqa: E731
    monkeypatch.setitem(AttentionInterface._global_mapping, SEGMENT_SDPA, counted)
    segments = logits_and_grads(PackedSequences(model), model, ids, mask)
    assert len(calls) == model.config.num_hidden_layers and model.config._attn_implementation == "sdpa"

    monkeypatch.setattr("roll.distributed.sequence_packing.uses_segment_attention", lambda *_: False)
    masked = logits_and_grads(PackedSequences(model), model, ids, mask)  # transformers' block-diagonal mask
    padded = logits_and_grads(model, model, ids, mask)
    for other in (masked, padded):
        assert_close(segments[0], other[0], rtol=1e-5, atol=1e-5)
        for name, grad in other[1].items():
            assert_close(segments[1][name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_gradient_checkpointing_keeps_the_mask_and_the_padded_gradients():
    """Checkpointed layers are recomputed in backward, after the pass has put sdpa back: no
    segments there (with them, torch's checkpoint finds the recomputation differs and raises)."""
    model = tiny_llama(0)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    assert not uses_segment_attention(model, 9)
    with torch.no_grad():
        assert uses_segment_attention(model, 9)  # no backward, nothing recomputed
    ids, mask = packed_inputs([9, 3, 6])
    packed = logits_and_grads(PackedSequences(model), model, ids, mask)
    padded = logits_and_grads(model, model, ids, mask)
    for name, grad in padded[1].items():
        assert_close(packed[1][name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_only_sdpa_without_a_shorter_sliding_window_uses_segments():
    assert uses_segment_attention(tiny_llama(0), 9)
    assert not uses_segment_attention(tiny_llama(0, sliding_window=8), 9)
    assert uses_segment_attention(tiny_llama(0, sliding_window=9), 9)
    for name in ("eager", "flash_attention_2"):
        model = tiny_llama(0)
        model.config._attn_implementation = name
        assert not uses_segment_attention(model, 9)
