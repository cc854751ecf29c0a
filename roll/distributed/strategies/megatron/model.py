"""A megatron-core `GPTModel` built from an HF Llama/Qwen2 config, called like an HF causal LM.

Imports megatron-core at module level: import it only after `check_megatron_available`.

The model is megatron-core's own (`GPTModel` with the local layer spec, no Transformer Engine),
with three pieces of ours where the stock ones call `torch.cuda` unconditionally: core attention
through torch's SDPA (`SdpaAttention`), rotary frequencies kept in a buffer that follows the model's
device (`BufferRotaryEmbedding`), and the gather of vocabulary-parallel logits (`GatherVocabSlices`).

Contract: `MegatronCausalLM` is called HF-style, `model(input_ids=, attention_mask=, labels=)` -> an
output with `.logits` (B, T, V) and `.loss`; with pipeline parallelism every stage still returns
the whole model's logits (roll.distributed.strategies.megatron.pipeline). Sequence packing calls it
as it calls an HF model (roll.distributed.sequence_packing.PackedSequences): one row (1, N) of
sequences back to back, `position_ids` restarting at 0 for each; that runs as megatron's packed
"thd" format (`packed_sequences`), RoPE and attention per sequence.

Why each piece is ours: docs/engines/megatron.md, "Internals".
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers.modeling_outputs import CausalLMOutput

from roll.distributed.strategies.megatron.convert import DecoderArch
from roll.distributed.strategies.megatron.pipeline import (
    PipelineLinks,
    broadcast_logits,
    logits_from_last_stage,
    receive_activation,
)

with warnings.catch_warnings():  # "Apex / Transformer Engine not installed": we use neither
    warnings.simplefilter("ignore", UserWarning)
    from megatron.core import parallel_state
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.module import MegatronModule
    from megatron.core.transformer.transformer_config import TransformerConfig

IGNORE_INDEX = -100  # label of tokens left out of the loss, as in HF


def init_model_parallel(tensor_parallel: int = 1, pipeline_parallel: int = 1) -> None:
    """Megatron's process groups over the default torch.distributed group, once per process.

    The default group must exist (roll.distributed.strategies.process_group). A second call with
    other sizes is an error: megatron keeps its groups in module globals, one layout per process.
    """
    if parallel_state.model_parallel_is_initialized():
        have = (
            parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_pipeline_model_parallel_world_size(),
        )
        if have != (tensor_parallel, pipeline_parallel):
            raise RuntimeError(f"megatron is already initialised with (tp, pp) = {have} in this process")
        return
    parallel_state.initialize_model_parallel(tensor_parallel, pipeline_parallel, create_gloo_process_groups=False)


def transformer_config(
    arch: DecoderArch,
    dtype: torch.dtype,
    tensor_parallel: int = 1,
    sequence_parallel: bool = False,
    pipeline_parallel: int = 1,
    stage_layers: tuple[int | None, int | None] = (None, None),
) -> TransformerConfig:
    """The `TransformerConfig` of an HF Llama/Qwen2 model: pre-norm RMSNorm, SwiGLU MLP without
    biases, grouped-query attention with q/k/v biases only for Qwen2, no dropout (PPO compares
    forwards of the same weights, see roll.distributed.strategies.torch_train).

    Parameters are created on CPU and left uninitialised (the HF weights are loaded next), and
    every fused kernel is off: they need CUDA or Apex and change no result."""
    return TransformerConfig(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        ffn_hidden_size=arch.ffn_hidden_size,
        num_attention_heads=arch.num_heads,
        num_query_groups=arch.num_query_groups,
        kv_channels=arch.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=arch.norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=arch.qkv_bias,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tensor_parallel,
        pipeline_model_parallel_size=pipeline_parallel,
        num_layers_in_first_pipeline_stage=stage_layers[0],
        num_layers_in_last_pipeline_stage=stage_layers[1],
        pipeline_dtype=dtype,
        sequence_parallel=sequence_parallel,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        use_cpu_initialization=True,
        perform_initialization=False,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        cuda_graph_scope=[],  # what its default "full" means, without the deprecation warning
    )


class SdpaAttention(MegatronModule):
    """Megatron core attention by `torch.nn.functional.scaled_dot_product_attention` (see module
    docstring). Grouped-query attention maps query head h to KV head h // (heads / groups), as
    Megatron's interleaved qkv and HF's `repeat_kv` both do."""

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type,
        attention_type: str,
        cp_comm_type: str | None = None,
        softmax_scale: float | None = None,
        pg_collection=None,
    ) -> None:
        super().__init__(config=config)
        if config.attention_dropout or config.context_parallel_size > 1:
            raise ValueError("SdpaAttention supports neither attention dropout nor context parallelism")
        self.softmax_scale = softmax_scale  # None: 1 / sqrt(head_dim)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type=None,
        attention_bias=None,
        packed_seq_params=None,
    ) -> torch.Tensor:
        """query (Sq, B, heads, d), key and value (Sk, B, groups, d) -> (Sq, B, heads * d).

        `attention_mask`: None for plain causal attention, else (B, 1, Sq, Sk) bool with True
        where attention is blocked (Megatron's convention), as `blocked_attention` builds it.
        `packed_seq_params`: packed sequences in megatron's "thd" layout (`_per_sequence`)."""
        if attention_bias is not None:
            raise ValueError("SdpaAttention takes no attention bias")
        if packed_seq_params is not None:
            return self._per_sequence(query, key, value, attention_mask, packed_seq_params)
        q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))
        allowed = None if attention_mask is None else ~attention_mask
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed, is_causal=attention_mask is None, scale=self.softmax_scale, enable_gqa=True
        )
        return out.permute(2, 0, 1, 3).reshape(query.shape[0], query.shape[1], -1)

    def _per_sequence(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        packed: PackedSeqParams,
    ) -> torch.Tensor:
        """The thd layout: query (N, heads, d), key and value (N, groups, d), sequences back to back at
        `packed.cu_seqlens_q` -> (N, heads * d), causal attention inside each sequence. What
        Transformer Engine's attention does with the same parameters, as one SDPA call per
        sequence: the work is the sum of the squared lengths, not the square of their sum (a
        block-diagonal mask over the packed row would cost that)."""
        if packed.qkv_format != "thd" or attention_mask is not None:
            raise ValueError("SdpaAttention takes packed sequences in the thd layout, without an attention mask")
        bounds = packed.cu_seqlens_q.tolist()
        outputs = []
        for start, end in zip(bounds[:-1], bounds[1:], strict=True):
            q, k, v = (x[start:end].transpose(0, 1)[None] for x in (query, key, value))  # (1, heads, L, d)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale, enable_gqa=True)
            outputs.append(out[0].transpose(0, 1).flatten(1))
        return torch.cat(outputs)


class BufferRotaryEmbedding(RotaryEmbedding):
    """Megatron's `RotaryEmbedding` with its inverse frequencies in a non-persistent buffer, so
    they move with the model and `get_emb` never calls `torch.cuda` (see module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        inv_freq = self.inv_freq
        del self.inv_freq
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def get_emb(self, max_seq_len: int, offset: int = 0) -> torch.Tensor:
        """(S, 1, 1, head_dim) angles in rotate-half order ([freqs, freqs]), HF's RoPE layout."""
        if self.rotary_interleaved:
            raise ValueError("BufferRotaryEmbedding computes the non-interleaved (rotate-half) layout only")
        freqs = self.get_freqs_non_repeated(max_seq_len, offset)
        return torch.cat((freqs, freqs), dim=-1)[:, None, None, :]


_TE_ATTENTION_SWITCHES = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN")


def build_gpt_model(
    arch: DecoderArch,
    dtype: torch.dtype,
    tensor_parallel: int = 1,
    sequence_parallel: bool = False,
    pg_collection: ProcessGroupCollection | None = None,
    recompute_granularity: str | None = None,
    pipeline_parallel: int = 1,
    stage_layers: tuple[int | None, int | None] = (None, None),
) -> GPTModel:
    """A `GPTModel` with `arch`'s shape on CPU, uninitialised (load weights next). Its vocabulary is
    `arch.vocab_size` rounded up to a multiple of `tensor_parallel` (Megatron's vocab padding).
    With tensor parallelism its logits are each rank's vocabulary slice (`MegatronCausalLM`
    gathers them: megatron's own gather allocates on CUDA). `pg_collection`: the model's process
    groups, by default those of `init_model_parallel`.

    With `pipeline_parallel` > 1 it is this rank's stage (megatron's pipeline rank): the embedding
    on the first stage only, final norm and output layer on the last only, and the layers megatron
    assigns the stage (`layer_offset`; `stage_layers`: the first and last stage's counts when
    uneven, None: an equal share). Tied embeddings are untied then: megatron would keep the
    last stage's copy equal by an all-reduce that moves it to CUDA (`setup_embeddings_and_output_layer`),
    so the last stage's output layer is a weight of its own, loaded with the embedding, whose
    gradient the strategy sums with the embedding's (megatron_train)."""
    config = transformer_config(arch, dtype, tensor_parallel, sequence_parallel, pipeline_parallel, stage_layers)
    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    spec.submodules.self_attention.submodules.core_attention = SdpaAttention
    with _without_te_attention_switches():
        gpt = GPTModel(
            config,
            spec,
            vocab_size=padded_vocab_size(arch, tensor_parallel),
            max_sequence_length=arch.max_positions,
            share_embeddings_and_output_weights=arch.tied_embeddings and pipeline_parallel == 1,
            position_embedding_type="rope",
            rotary_base=arch.rope_theta,
            pg_collection=pg_collection,
            **_stage_kwargs(pipeline_parallel, pg_collection),
        )
    gpt.rotary_pos_emb = BufferRotaryEmbedding(
        kv_channels=config.kv_channels,
        rotary_percent=1.0,
        rotary_interleaved=config.rotary_interleaved,
        rotary_base=arch.rope_theta,
        use_cpu_initialization=True,
        cp_group=gpt.pg_collection.cp,
    )
    for param in gpt.parameters():  # megatron builds its RMSNorm weights in float32 whatever params_dtype
        param.data = param.data.to(dtype)  # says; Megatron-LM's Float16Module casts them (buffers: RoPE stays fp32)
    recompute_(gpt, recompute_granularity)
    return gpt


def _stage_kwargs(pipeline_parallel: int, pg_collection: ProcessGroupCollection | None) -> dict[str, bool]:
    """With several pipeline stages: whether this rank's stage is the first (pre_process: the
    embedding) and the last (post_process: final norm and output layer); else nothing."""
    if pipeline_parallel <= 1:
        return {}
    pp_group = (pg_collection or ProcessGroupCollection.use_mpu_process_groups()).pp
    stage, stages = dist.get_rank(pp_group), dist.get_world_size(pp_group)
    return {"pre_process": stage == 0, "post_process": stage == stages - 1}


@contextmanager
def _without_te_attention_switches() -> Iterator[None]:
    """Transformer Engine's attention switches (ROLL's configs set them in system_envs) mean nothing
    to our SDPA attention, but megatron asserts they agree with its attention backend: hidden
    while the model is built, then restored as the user set them."""
    te_switches = {name: os.environ.pop(name) for name in _TE_ATTENTION_SWITCHES if name in os.environ}
    try:
        yield
    finally:
        for name in _TE_ATTENTION_SWITCHES:
            os.environ.pop(name, None)
        os.environ.update(te_switches)


def recompute_(gpt: GPTModel, granularity: str | None) -> None:
    """ROLL's `recompute_granularity`: "full" recomputes every decoder layer in the backward,
    "selective" only core attention (its (B, heads, T, T) scores are the big activation); None
    stores every activation. torch's non-reentrant `checkpoint` wraps the modules' forwards:
    megatron's own recomputation (`TransformerConfig.recompute_granularity`) forks the CUDA RNG
    tracker and stops on CPU ("Torch not compiled with CUDA enabled", measured with 0.16.1); with
    no dropout there is no randomness to replay, so this recomputes exactly the same values."""
    if granularity is None:
        return
    layers = list(gpt.decoder.layers)
    modules = layers if granularity == "full" else [layer.self_attention.core_attention for layer in layers]
    for module in modules:
        module.forward = functools.partial(checkpoint, module.forward, use_reentrant=False)


def padded_vocab_size(arch: DecoderArch, tensor_parallel: int) -> int:
    """The vocabulary rounded up to a multiple of the tensor-parallel size."""
    return -(-arch.vocab_size // tensor_parallel) * tensor_parallel


def load_megatron_state(gpt: GPTModel, state: dict[str, torch.Tensor]) -> None:
    """Copy `state` (tensors only, from roll.distributed.strategies.megatron.convert) into `gpt`'s
    parameters in place, strictly: every parameter set, no name left over. Megatron's
    `_extra_state` entries (empty for non-FP8 layers) are taken from the model itself."""
    extra = {k: v for k, v in gpt.state_dict().items() if k.endswith("_extra_state")}
    gpt.load_state_dict({**extra, **state}, strict=True)


def blocked_attention(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """HF's (B, T) 1/0 padding mask -> Megatron's (B, 1, T, T) bool mask, True where blocked.

    None (plain causal attention) when there is no padding. Otherwise query t sees key s <= t when
    s is a real token, so real tokens see exactly what they see in HF's model, wherever the padding
    is. Every query also sees itself: a padding query before any real token would otherwise see
    nothing and softmax would give NaN, which survives the masking of its output (NaN * 0).
    """
    if attention_mask is None or bool(attention_mask.all()):
        return None
    length = attention_mask.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=attention_mask.device).tril()
    allowed = causal & attention_mask.bool()[:, None, None, :]
    allowed |= torch.eye(length, dtype=torch.bool, device=attention_mask.device)
    return ~allowed


def packed_sequences(position_ids: torch.Tensor) -> PackedSeqParams:
    """Megatron's "thd" description of one packed row (1, N) whose positions restart at 0 where a
    sequence starts and count up inside it (`PackedSequences` builds them so):
    cu_seqlens [0, L1, L1 + L2, ..., N]. A one-line ValueError for any other `position_ids`.

    GPTModel applies RoPE per sequence from cu_seqlens (position t of a sequence, whatever its
    offset in the row) and hands them to core attention (`SdpaAttention._per_sequence`). They stay
    on the CPU: both read them on the host only (megatron's unfused RoPE splits by them), so a
    CUDA forward syncs once here, not in every layer."""
    positions = position_ids.cpu()
    if positions.dim() != 2 or positions.shape[0] != 1 or positions.shape[1] == 0 or positions[0, 0] != 0:
        raise ValueError(f"position_ids: one packed row (1, N) starting at 0 (got shape {tuple(positions.shape)})")
    positions = positions[0]
    starts = (positions == 0).nonzero().flatten()
    index = torch.arange(len(positions))
    if not torch.equal(positions, index - starts[torch.searchsorted(starts, index, right=True) - 1]):
        raise ValueError("position_ids: each packed sequence must count 0, 1, 2, ... (sequence packing's positions)")
    cu_seqlens = torch.cat([starts, torch.tensor([len(positions)])]).to(torch.int32)
    longest = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    return PackedSeqParams(
        qkv_format="thd", cu_seqlens_q=cu_seqlens, cu_seqlens_kv=cu_seqlens, max_seqlen_q=longest, max_seqlen_kv=longest
    )


class GatherVocabSlices(torch.autograd.Function):
    """Tensor-parallel ranks' vocabulary slices of the logits (..., V / n) -> whole (..., V).

    Megatron's own gather allocates on CUDA. The backward keeps this rank's slice of the gradient
    (not a sum over ranks): every rank of the group computes the same loss from the same gathered
    logits, so each slice's gradient is counted once, as in Megatron's gather."""

    @staticmethod
    def forward(ctx, local: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.rank, ctx.size = dist.get_rank(group), dist.get_world_size(group)
        slices = [torch.empty_like(local) for _ in range(ctx.size)]
        dist.all_gather(slices, local.contiguous(), group=group)
        return torch.cat(slices, dim=-1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.chunk(ctx.size, dim=-1)[ctx.rank].contiguous(), None


def layer_offset(gpt: GPTModel) -> int:
    """Index of the stage's first decoder layer in the whole model: megatron numbers a layer from 1
    with its stage's offset added (`get_transformer_layer_offset`), its state-dict name from 0."""
    return gpt.decoder.layers[0].layer_number - 1


class MegatronCausalLM(nn.Module):
    """A `GPTModel` behind HF's causal-LM call: positions 0..T-1 on every row (HF's default when
    no `position_ids` are given), padding blocked with `blocked_attention`, logits trimmed to the
    HF vocabulary, and HF's shifted cross-entropy when `labels` are given. With `position_ids`,
    one packed row of sequences (`packed_sequences`). With `pipeline` (this rank's stage of
    several, roll.distributed.strategies.megatron.pipeline) every stage is called with the same
    rows and returns the whole model's logits."""

    def __init__(self, gpt: GPTModel, vocab_size: int, pipeline: PipelineLinks | None = None) -> None:
        super().__init__()
        self.gpt = gpt
        self.vocab_size = vocab_size
        self.tp_group = gpt.pg_collection.tp
        self.pipeline = pipeline if pipeline is not None and pipeline.size > 1 else None

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        use_cache: bool = False,
    ) -> CausalLMOutput:
        """`position_ids`: packed rows (class docstring), with neither `attention_mask` nor
        `labels` (a shifted label would cross into the next sequence). `use_cache`: HF's switch,
        which `PackedSequences` passes; megatron keeps no KV cache here."""
        batch, length = input_ids.shape
        packed = None
        if position_ids is not None:
            if attention_mask is not None or labels is not None:
                raise ValueError("position_ids: packed rows take neither attention_mask nor labels")
            packed, positions = packed_sequences(position_ids), position_ids
        else:
            positions = torch.arange(length, device=input_ids.device).expand(batch, length)
        pipe = self.pipeline
        if pipe is not None and not pipe.first:  # (S, B, H): megatron's layout between layers
            shape = (length, batch, self.gpt.config.hidden_size)
            self.gpt.set_input_tensor(receive_activation(shape, self.gpt.config.params_dtype, input_ids.device, pipe))
        out = self.gpt(
            input_ids=input_ids,
            position_ids=positions,
            attention_mask=blocked_attention(attention_mask),
            packed_seq_params=packed,
        )
        if pipe is not None and not pipe.last:
            self.gpt.set_input_tensor(None)
            logits = logits_from_last_stage(out, (batch, length, self.vocab_size), pipe)
        else:
            logits = self._whole_vocabulary(out)
        loss = None
        if labels is not None:  # position t predicts token t + 1; mean over counted tokens. The labels
            # shift, not the logits: slicing (B, T, V) logits would copy them (HF does the same)
            targets = F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX)
        return CausalLMOutput(loss=loss, logits=logits)

    def _whole_vocabulary(self, logits: torch.Tensor) -> torch.Tensor:
        """The output layer's logits gathered over tensor-parallel ranks and trimmed to the HF
        vocabulary; on the last of several stages, also sent to the others."""
        if dist.get_world_size(self.tp_group) > 1:
            logits = GatherVocabSlices.apply(logits, self.tp_group)
        logits = logits[..., : self.vocab_size]
        if self.pipeline is not None:
            self.gpt.set_input_tensor(None)
            broadcast_logits(logits, self.pipeline)
        return logits
