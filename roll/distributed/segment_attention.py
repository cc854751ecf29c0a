"""Causal attention run segment by segment on a packed row, where flash attention's varlen kernels are absent.

A packed row (1, N) holds several sequences end to end (roll.distributed.sequence_packing). With
sdpa, transformers keeps attention inside each of them through a block-diagonal mask over the
whole row, and the kernel still works on all (sum L_i)^2 query-key pairs: on CPU, and on GPUs
without flash-attn, sdpa cannot skip the masked blocks. `segment_sdpa_attention` instead runs
transformers' own sdpa attention on each segment with a plain causal mask (GQA, scaling and
dropout as the model's sdpa has them): sum L_i^2 pairs, the same numbers up to round-off.

It is registered in transformers' `AttentionInterface` as `SEGMENT_SDPA` and reads the segments
from flash attention's varlen keywords (`FlashAttentionKwargs`: `cu_seq_lens_q`, the (S + 1,)
offsets of the segments), which a model hands from its call down to every attention function.
No mask function is registered under that name, so transformers builds no (N, N) mask for it.
`segment_kwargs(lengths)` gives those keywords, `uses_segment_attention(model, longest)` says
whether a pass may use it, and `segment_attention(model)` switches the model to it for one pass.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PretrainedConfig, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward

SEGMENT_SDPA = "roll_segment_sdpa"


def segment_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Causal sdpa per segment. query (1, H, N, D), key and value (1, H_kv, N, D), segments at the
    offsets `cu_seq_lens_q` (S + 1,), 0 ... N; returns ((1, N, H, D), None) as sdpa does."""
    if cu_seq_lens_q is None or attention_mask is not None:
        raise ValueError(f"{SEGMENT_SDPA} runs packed rows only: cu_seq_lens_q and no attention mask")
    offsets = cu_seq_lens_q.tolist()
    outputs = [
        sdpa_attention_forward(
            module, query[:, :, start:end], key[:, :, start:end], value[:, :, start:end], None,
            dropout=dropout, scaling=scaling, is_causal=True, softcap=kwargs.get("softcap"),
        )[0]
        for start, end in zip(offsets[:-1], offsets[1:], strict=True)
    ]  # fmt: skip
    return torch.cat(outputs, dim=1), None


AttentionInterface.register(SEGMENT_SDPA, segment_sdpa_attention)


def segment_kwargs(lengths: torch.Tensor) -> dict:
    """The varlen keywords of a packed row made of sequences of `lengths` tokens (empty ones skipped)."""
    lengths = lengths[lengths > 0]
    offsets = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    longest = int(lengths.max()) if len(lengths) else 0
    return {"cu_seq_lens_q": offsets, "cu_seq_lens_k": offsets, "max_length_q": longest, "max_length_k": longest}


def uses_segment_attention(model: torch.nn.Module, longest: int) -> bool:
    """Whether a packed pass of `model` may run `SEGMENT_SDPA`: the model attends with sdpa (flash
    attention has its own varlen kernels, eager and flex keep the mask), no sliding window shorter
    than the longest segment, and no layer that gradient checkpointing will recompute in backward
    (the recomputation reads the model's attention then, after the pass has switched it back)."""
    config = _hf_config(model)
    if config is None or config._attn_implementation != "sdpa":
        return False
    window = getattr(config, "sliding_window", None)
    if window is not None and window < longest:
        return False
    recomputes = torch.is_grad_enabled() and any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
    return not recomputes


@contextmanager
def segment_attention(model: torch.nn.Module):
    """`model` attends with `SEGMENT_SDPA` inside the block, with what was configured after it."""
    config = _hf_config(model)
    assert config is not None  # uses_segment_attention(model) said yes, so it found the config
    configured = config._attn_implementation
    config._attn_implementation = SEGMENT_SDPA
    try:
        yield
    finally:
        config._attn_implementation = configured


def _hf_config(model: torch.nn.Module) -> PretrainedConfig | None:
    """The config of the outermost transformers model in `model`, which may be a DeepSpeed engine
    or a peft model around it (their `config` is not the model's)."""
    return next((m.config for m in model.modules() if isinstance(m, PreTrainedModel)), None)
