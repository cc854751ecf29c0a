"""HF Llama/Qwen2 weights <-> megatron-core `GPTModel` weights, and their tensor-parallel shards.

Pure functions over state dicts (no megatron import), so they are tested on any machine. The
Megatron side is the layout of a `GPTModel` built with the local layer spec
(roll.distributed.strategies.megatron.model), whose norms are their own modules.

Contract: HF -> Megatron -> HF is exact. q/k/v become one `linear_qkv` interleaved per query group,
gate/up become `linear_fc1` = [gate; up]; tied embeddings emit `lm_head.weight` on the way back.
`split_tensor_parallel` / `merge_tensor_parallel` cut column-parallel layers along dim 0 and
row-parallel ones along dim 1 (`linear_fc1` per half); `stage_state` / `from_stage` give a
pipeline stage its layers under local indices, the embedding on the first stage and the final
norm and output layer on the last.

Each layout, row by row: docs/engines/megatron.md, "Internals".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

Tensors = dict[str, torch.Tensor]
HF_LAYER, MC_LAYER = "model.layers.{}.", "decoder.layers.{}."
# HF -> Megatron names of the tensors that are only renamed, within a layer and at the top level.
LAYER_RENAMES = {
    "input_layernorm.weight": "input_layernorm.weight",
    "post_attention_layernorm.weight": "pre_mlp_layernorm.weight",
    "self_attn.o_proj.weight": "self_attention.linear_proj.weight",
    "mlp.down_proj.weight": "mlp.linear_fc2.weight",
}
TOP_RENAMES = {"model.norm.weight": "decoder.final_layernorm.weight"}
EMBEDDING, OUTPUT = "embedding.word_embeddings.weight", "output_layer.weight"
HF_EMBEDDING, HF_OUTPUT = "model.embed_tokens.weight", "lm_head.weight"
COLUMN_PARALLEL = ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias", EMBEDDING, OUTPUT)
ROW_PARALLEL = ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight")
GATED = "mlp.linear_fc1.weight"


@dataclass(frozen=True)
class DecoderArch:
    """What the conversion and the `TransformerConfig` need to know of an HF Llama/Qwen2 config."""

    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_heads: int
    num_query_groups: int
    head_dim: int
    vocab_size: int
    qkv_bias: bool
    tied_embeddings: bool
    rope_theta: float
    norm_eps: float
    max_positions: int

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_query_groups


def arch_from_hf(config: Any) -> DecoderArch:
    """The `DecoderArch` of an HF Llama or Qwen2 config; a one-line ValueError for anything the
    Megatron model would compute differently (so it never trains a silently different model)."""
    kind = getattr(config, "model_type", None)
    rope = dict(getattr(config, "rope_parameters", None) or {})
    unsupported = {
        "model_type (llama and qwen2 are supported)": kind not in ("llama", "qwen2"),
        "hidden_act (only silu: SwiGLU)": getattr(config, "hidden_act", "silu") != "silu",
        "rope scaling (only default RoPE)": rope.get("rope_type", "default") != "default",
        "attention_bias (an o_proj bias)": kind == "llama" and getattr(config, "attention_bias", False),
        "mlp_bias": getattr(config, "mlp_bias", False),
        "sliding-window attention": getattr(config, "use_sliding_window", False),
    }
    found = [name for name, bad in unsupported.items() if bad]
    if found:
        raise ValueError(f'strategy "megatron" cannot convert this {kind} model: unsupported {found[0]}')
    heads = config.num_attention_heads
    return DecoderArch(
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        ffn_hidden_size=config.intermediate_size,
        num_heads=heads,
        num_query_groups=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        vocab_size=config.vocab_size,
        qkv_bias=kind == "qwen2",
        tied_embeddings=bool(config.tie_word_embeddings),
        rope_theta=float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))),
        norm_eps=float(config.rms_norm_eps),
        max_positions=config.max_position_embeddings,
    )


# ---- one layer's attention and MLP ---------------------------------------------------------
def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, arch: DecoderArch) -> torch.Tensor:
    """HF q (heads * d, ...), k and v (groups * d, ...) -> Megatron's interleaved linear_qkv
    (groups * (r + 2) * d, ...): per group g, its r query heads, then k_g, then v_g. Weights
    (2-D) and biases (1-D) alike."""
    groups, rest = arch.num_query_groups, q.shape[1:]
    q = q.reshape(groups, arch.heads_per_group * arch.head_dim, *rest)
    k, v = (x.reshape(groups, arch.head_dim, *rest) for x in (k, v))
    return torch.cat([q, k, v], dim=1).reshape(-1, *rest)


def split_qkv(qkv: torch.Tensor, arch: DecoderArch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of `fuse_qkv`: Megatron linear_qkv -> HF (q, k, v)."""
    rest, d = qkv.shape[1:], arch.head_dim
    per_group = qkv.reshape(arch.num_query_groups, (arch.heads_per_group + 2) * d, *rest)
    q, k, v = per_group.split([arch.heads_per_group * d, d, d], dim=1)
    return tuple(x.reshape(-1, *rest) for x in (q, k, v))


def _pad_rows(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """`weight` with zero rows appended up to `rows` (a vocabulary padded for tensor parallelism)."""
    if rows < weight.shape[0]:
        raise ValueError(f"padded vocabulary {rows} is smaller than the model's {weight.shape[0]}")
    return torch.cat([weight, weight.new_zeros(rows - weight.shape[0], *weight.shape[1:])])


# ---- whole models ---------------------------------------------------------------------------
def hf_to_megatron(hf: Mapping[str, torch.Tensor], arch: DecoderArch, padded_vocab_size: int | None = None) -> Tensors:
    """An HF Llama/Qwen2 causal-LM state dict -> the state dict of a TP-1 `GPTModel` (without
    Megatron's `_extra_state` entries). `padded_vocab_size` appends zero rows to the embedding
    and output layer, as Megatron pads a vocabulary to a multiple of the tensor-parallel size."""
    vocab = padded_vocab_size or arch.vocab_size
    out = {EMBEDDING: _pad_rows(hf[HF_EMBEDDING], vocab)}
    for i in range(arch.num_layers):
        src, dst = HF_LAYER.format(i), MC_LAYER.format(i)
        for hf_name, mc_name in LAYER_RENAMES.items():
            out[dst + mc_name] = hf[src + hf_name]
        attn = src + "self_attn."
        for kind in ("weight", "bias") if arch.qkv_bias else ("weight",):
            q, k, v = (hf[f"{attn}{p}_proj.{kind}"] for p in "qkv")
            out[f"{dst}self_attention.linear_qkv.{kind}"] = fuse_qkv(q, k, v, arch)
        out[dst + GATED] = torch.cat([hf[src + "mlp.gate_proj.weight"], hf[src + "mlp.up_proj.weight"]])
    for hf_name, mc_name in TOP_RENAMES.items():
        out[mc_name] = hf[hf_name]
    if not arch.tied_embeddings:
        out[OUTPUT] = _pad_rows(hf[HF_OUTPUT], vocab)
    return out


def megatron_to_hf(mc: Mapping[str, torch.Tensor], arch: DecoderArch) -> Tensors:
    """Inverse of `hf_to_megatron`: a TP-1 `GPTModel` state dict -> HF names and shapes (padded
    vocabulary rows dropped; with tied embeddings `lm_head.weight` is the embedding tensor, as in
    an HF state dict). Entries that are not tensors (`_extra_state`) are ignored."""
    out = {HF_EMBEDDING: mc[EMBEDDING][: arch.vocab_size]}
    for i in range(arch.num_layers):
        src, dst = MC_LAYER.format(i), HF_LAYER.format(i)
        for hf_name, mc_name in LAYER_RENAMES.items():
            out[dst + hf_name] = mc[src + mc_name]
        for kind in ("weight", "bias") if arch.qkv_bias else ("weight",):
            q, k, v = split_qkv(mc[f"{src}self_attention.linear_qkv.{kind}"], arch)
            for proj, tensor in zip("qkv", (q, k, v), strict=True):
                out[f"{dst}self_attn.{proj}_proj.{kind}"] = tensor
        gate, up = mc[src + GATED].chunk(2)
        out[dst + "mlp.gate_proj.weight"], out[dst + "mlp.up_proj.weight"] = gate, up
    for hf_name, mc_name in TOP_RENAMES.items():
        out[hf_name] = mc[mc_name]
    out[HF_OUTPUT] = out[HF_EMBEDDING] if arch.tied_embeddings else mc[OUTPUT][: arch.vocab_size]
    return out


# ---- tensor-parallel shards -----------------------------------------------------------------
def _split_dim(name: str) -> int | None:
    """0 for a column-parallel tensor, 1 for a row-parallel one, None for a replicated one."""
    if name.endswith(COLUMN_PARALLEL):
        return 0
    if name.endswith(ROW_PARALLEL):
        return 1
    return None


def is_tensor_parallel(name: str) -> bool:
    """Whether `split_tensor_parallel` cuts the tensor `name` over the ranks (else it is replicated)."""
    return name.endswith(GATED) or _split_dim(name) is not None


def check_tensor_parallel(arch: DecoderArch, tp_size: int, vocab_size: int) -> None:
    """A one-line ValueError unless every split dimension divides by `tp_size`. Query groups must
    divide: a rank then holds whole groups of the interleaved qkv (Megatron's layout for fewer
    groups than ranks, which replicates a KV head over ranks, is not supported here)."""
    sizes = {
        "num_query_groups": arch.num_query_groups,
        "ffn_hidden_size": arch.ffn_hidden_size,
        "the vocabulary size": vocab_size,
    }
    for name, size in sizes.items():
        if size % tp_size:
            hint = " (pad it: hf_to_megatron's padded_vocab_size)" if name == "the vocabulary size" else ""
            raise ValueError(f"tensor parallel size {tp_size} does not divide {name} = {size}{hint}")


def split_tensor_parallel(mc: Mapping[str, torch.Tensor], arch: DecoderArch, tp_size: int) -> list[Tensors]:
    """A TP-1 `GPTModel` state dict -> one state dict per tensor-parallel rank (see module
    docstring). The shards are contiguous copies, ready for each rank's model."""
    check_tensor_parallel(arch, tp_size, mc[EMBEDDING].shape[0])
    shards: list[Tensors] = [{} for _ in range(tp_size)]
    for name, tensor in mc.items():
        pieces: Sequence[torch.Tensor]
        if name.endswith(GATED):
            gates, ups = (half.chunk(tp_size) for half in tensor.chunk(2))
            pieces = [torch.cat([g, u]) for g, u in zip(gates, ups, strict=True)]
        elif (dim := _split_dim(name)) is not None:
            pieces = tensor.chunk(tp_size, dim=dim)
        else:
            pieces = [tensor] * tp_size
        for shard, piece in zip(shards, pieces, strict=True):
            shard[name] = piece.contiguous()
    return shards


def merge_tensor_parallel(shards: Sequence[Mapping[str, torch.Tensor]]) -> Tensors:
    """Inverse of `split_tensor_parallel`: per-rank state dicts -> one TP-1 state dict.
    Replicated tensors are taken from rank 0."""
    merged: Tensors = {}
    for name, first in shards[0].items():
        pieces = [shard[name] for shard in shards]
        if name.endswith(GATED):
            halves = [piece.chunk(2) for piece in pieces]
            merged[name] = torch.cat([h[0] for h in halves] + [h[1] for h in halves])
        elif (dim := _split_dim(name)) is not None:
            merged[name] = torch.cat(pieces, dim=dim)
        else:
            merged[name] = first
    return merged


# ---- pipeline stages ------------------------------------------------------------------------
LAYERS_PREFIX = MC_LAYER.split("{")[0]


def renumber_layers(state: Mapping[str, torch.Tensor], shift: int, keep: range | None = None) -> Tensors:
    """`state`'s `decoder.layers.{i}.*` entries renamed to layer i + shift (those with i in `keep`
    only, when given); other entries dropped."""
    out: Tensors = {}
    for name, tensor in state.items():
        if name.startswith(LAYERS_PREFIX):
            index, rest = name.removeprefix(LAYERS_PREFIX).split(".", 1)
            if keep is None or int(index) in keep:
                out[f"{LAYERS_PREFIX}{int(index) + shift}.{rest}"] = tensor
    return out


def stage_state(
    mc: Mapping[str, torch.Tensor], arch: DecoderArch, offset: int, num_stage_layers: int, first: bool, last: bool
) -> Tensors:
    """A whole (all layers) `GPTModel` state dict -> one pipeline stage's (module docstring): layers
    offset .. offset + num_stage_layers - 1 renamed from 0, the embedding if `first`, the final norm
    and output layer if `last` (with tied embeddings and `last` but not `first`: the embedding)."""
    out = renumber_layers(mc, -offset, range(offset, offset + num_stage_layers))
    if first:
        out[EMBEDDING] = mc[EMBEDDING]
    if last:
        for name in TOP_RENAMES.values():
            out[name] = mc[name]
        if not arch.tied_embeddings:
            out[OUTPUT] = mc[OUTPUT]
        elif not first:
            out[OUTPUT] = mc[EMBEDDING]
    return out


def from_stage(stage: Mapping[str, torch.Tensor], offset: int, arch: DecoderArch) -> Tensors:
    """Inverse of `stage_state` for one stage: its entries under whole-model names (layers shifted
    by `offset`; a tied output copy dropped, the first stage's embedding stands for it)."""
    out = renumber_layers(stage, offset)
    out.update(
        {
            name: tensor
            for name, tensor in stage.items()
            if not name.startswith(LAYERS_PREFIX) and not (name == OUTPUT and arch.tied_embeddings)
        }
    )
    return out
