"""LoRA on the `megatron` strategy: adapters around megatron-core's tensor-parallel linear layers.

peft's Megatron path does not run with megatron-core 0.16, so `ParallelLoRA` is the same
construction written out, and the adapters it trains are exported as an ordinary peft adapter of
the HF model (`adapter_to_hf`), so the other strategies' checkpoint format holds.

Contract: `lora_target` takes HF names or megatron's; each names one of the four fused parallel
linears of a decoder layer (`q_proj` adapts the whole `linear_qkv`, so k and v too); any other name
is refused by name (`megatron_targets`). An adapter is cut over tensor-parallel ranks the way its
layer is, so B_local @ A_local is the rank's shard of B @ A and merged weights (`merged_state`)
gather like the layers. Adapters are float32, drawn from one seeded generator in full and then
cut, so every tensor- and pipeline-parallel size starts from the same adapters.

Why not peft, the target map and the cut: docs/engines/megatron.md, "Internals".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from roll.distributed.strategies.megatron.convert import DecoderArch, fuse_qkv, split_qkv
from roll.models.lora import target_modules

if TYPE_CHECKING:  # megatron-core ships no type information: mypy reads these as Any
    from megatron.core.models.gpt import GPTModel
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

QKV, PROJ, FC1, FC2 = ("self_attention.linear_qkv", "self_attention.linear_proj", "mlp.linear_fc1", "mlp.linear_fc2")
TARGET_MODULES = {
    "q_proj": QKV,
    "k_proj": QKV,
    "v_proj": QKV,
    "linear_qkv": QKV,
    "o_proj": PROJ,
    "linear_proj": PROJ,
    "gate_proj": FC1,
    "up_proj": FC1,
    "linear_fc1": FC1,
    "down_proj": FC2,
    "linear_fc2": FC2,
}
"""`lora_target` name (HF or megatron) -> the megatron module it adapts, within a decoder layer."""
ROW_PARALLEL = (PROJ, FC2)
"""Modules split by input columns (A is split, B replicated); the others by output rows."""
HF_PARTS = {
    QKV: ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    PROJ: ("self_attn.o_proj",),
    FC1: ("mlp.gate_proj", "mlp.up_proj"),
    FC2: ("mlp.down_proj",),
}
"""The HF linears a fused megatron module stands for, in the order its output rows hold them."""
HF_ADAPTER_PREFIX = "base_model.model.model.layers.{}."
"""Key prefix of a decoder layer's tensors in a saved peft adapter (peft drops the adapter name)."""


def megatron_targets(target: str) -> list[str]:
    """The megatron modules (`QKV`, `PROJ`, `FC1`, `FC2`) that `lora_target` adapts, in that
    order; a one-line ValueError naming the first listed module with no megatron counterpart."""
    names = target_modules(target)
    if names == "all-linear":
        return [QKV, PROJ, FC1, FC2]
    if not names:
        raise ValueError("lists no module name")
    unknown = [name for name in names if name not in TARGET_MODULES]
    if unknown:
        raise ValueError(
            f"{unknown[0]!r} has no counterpart in the megatron model (targets: "
            f"{', '.join(TARGET_MODULES)} or all-linear)"
        )
    wanted = {TARGET_MODULES[name] for name in names}
    return [module for module in (QKV, PROJ, FC1, FC2) if module in wanted]


class ParallelLoRA(nn.Module):
    """One of megatron's parallel linears (`base_layer`, frozen) plus a LoRA adapter cut over the
    tensor-parallel ranks as the module docstring says; called and answering like the base layer:
    `forward(x) -> (output, bias)`. `lora_A` and `lora_B` are this rank's pieces."""

    def __init__(
        self,
        base_layer: ColumnParallelLinear | RowParallelLinear,
        *,
        rank: int,
        alpha: int,
        row_parallel: bool,
        tp_group,
        tp_rank: int,
        tp_size: int,
        generator: torch.Generator,
    ) -> None:
        super().__init__()
        self.base_layer, self.row_parallel, self.tp_group = base_layer, row_parallel, tp_group
        self.scaling = alpha / rank
        out_local = base_layer.weight.shape[0]
        full_a = _draw_whole_a(base_layer, rank, row_parallel, tp_size, generator)
        a = full_a.chunk(tp_size, dim=1)[tp_rank] if row_parallel else full_a
        device = base_layer.weight.device
        self.lora_A = nn.Parameter(a.contiguous().to(device))
        self.lora_B = nn.Parameter(torch.zeros(out_local, rank, device=device))

    def forward(self, x: torch.Tensor, *args, **kwargs):
        from megatron.core.tensor_parallel import (
            copy_to_tensor_model_parallel_region,
            reduce_from_tensor_model_parallel_region,
        )

        out, bias = self.base_layer(x, *args, **kwargs)
        h = F.linear(x.to(self.lora_A.dtype), self.lora_A)
        # row parallel: sum the ranks' partial A x; column parallel: A's gradient from every B shard
        h = (reduce_from_tensor_model_parallel_region if self.row_parallel else copy_to_tensor_model_parallel_region)(
            h, group=self.tp_group
        )
        return (out + F.linear(h, self.lora_B) * self.scaling).to(out.dtype), bias

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:  # megatron reads attributes of its layers (config, sequence_parallel, ...)
            if name == "base_layer":
                raise
            return getattr(self.base_layer, name)


def _draw_whole_a(
    base_layer: ColumnParallelLinear | RowParallelLinear,
    rank: int,
    row_parallel: bool,
    tp_size: int,
    generator: torch.Generator,
) -> torch.Tensor:
    """The whole (all tensor-parallel ranks') A of an adapter on `base_layer`, drawn as peft's
    kaiming_uniform_(a=sqrt(5)) draws it, from `generator`."""
    in_local = base_layer.weight.shape[1]
    in_full = in_local * tp_size if row_parallel else in_local
    bound = 1 / math.sqrt(in_full)
    return torch.empty(rank, in_full).uniform_(-bound, bound, generator=generator)


def apply_megatron_lora(
    gpt: GPTModel,
    *,
    rank: int,
    alpha: int,
    target: str,
    tp_group,
    tp_rank: int,
    tp_size: int,
    seed: int,
    layer_offset: int = 0,
) -> list[str]:
    """Freeze `gpt` and put a `ParallelLoRA` around each targeted module of every decoder layer;
    returns the wrapped modules' names (the model's own: a pipeline stage numbers its layers from 0).
    A is drawn from a generator seeded with `seed`, in full and in module order on every rank (then
    cut), so ranks and tensor-parallel sizes agree; a pipeline stage whose first layer is layer
    `layer_offset` of the model first draws (and drops) the A of the layers before it, which have
    its layers' shapes, so every pipeline size starts from the same adapters too."""
    modules = megatron_targets(target)
    for param in gpt.parameters():
        param.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    template = gpt.decoder.layers[0]
    for _ in range(layer_offset):
        for module in modules:
            parent_name, child = module.split(".")
            _draw_whole_a(
                getattr(getattr(template, parent_name), child), rank, module in ROW_PARALLEL, tp_size, generator
            )
    wrapped = []
    for index, layer in enumerate(gpt.decoder.layers):
        for module in modules:
            parent_name, child = module.split(".")
            parent = getattr(layer, parent_name)
            setattr(
                parent,
                child,
                ParallelLoRA(
                    getattr(parent, child),
                    rank=rank,
                    alpha=alpha,
                    row_parallel=module in ROW_PARALLEL,
                    tp_group=tp_group,
                    tp_rank=tp_rank,
                    tp_size=tp_size,
                    generator=generator,
                ),
            )
            wrapped.append(f"decoder.layers.{index}.{module}")
    return wrapped


# ---- state dicts (pure functions) ------------------------------------------------------------
def merged_state(state: Mapping[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """A LoRA-wrapped `GPTModel`'s state dict (one rank's) -> the plain model's, merged:
    `X.base_layer.weight` + scaling * `X.lora_B` @ `X.lora_A` becomes `X.weight` (computed in
    float32, stored in the base dtype), other `X.base_layer.*` entries become `X.*`, the adapter
    tensors go. On a tensor-parallel rank this is its shard of the merged model (module docstring)."""
    merged = {}
    for name, value in state.items():
        if name.endswith((".lora_A", ".lora_B")):
            continue
        if ".base_layer." in name:
            module, param = name.split(".base_layer.")
            if param == "weight" and f"{module}.lora_A" in state:
                delta = state[f"{module}.lora_B"].float() @ state[f"{module}.lora_A"].float()
                value = (value.float() + scaling * delta).to(value.dtype)
            name = f"{module}.{param}"
        merged[name] = value
    return merged


def adapter_state(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter tensors (`*.lora_A`, `*.lora_B`) of a wrapped model's state dict."""
    return {name: value for name, value in state.items() if name.endswith((".lora_A", ".lora_B"))}


def is_sharded_adapter(name: str) -> bool:
    """Whether adapter tensor `name` is cut over tensor-parallel ranks: B of a column-parallel
    module, A of a row-parallel one (the other is replicated)."""
    module, kind = name.rsplit(".", 1)
    return kind == ("lora_A" if module.endswith(ROW_PARALLEL) else "lora_B")


def split_adapter(adapter: Mapping[str, torch.Tensor], tp_size: int) -> list[dict[str, torch.Tensor]]:
    """A whole (TP-1) adapter -> one per tensor-parallel rank, cut like the weights they adapt:
    row-parallel A by columns, column-parallel B by rows (linear_fc1's per gate/up half)."""
    shards: list[dict[str, torch.Tensor]] = [{} for _ in range(tp_size)]
    for name, tensor in adapter.items():
        pieces: Sequence[torch.Tensor]
        if not is_sharded_adapter(name):
            pieces = [tensor] * tp_size
        elif name.endswith(".lora_A"):
            pieces = tensor.chunk(tp_size, dim=1)
        elif name.endswith(f"{FC1}.lora_B"):
            gates, ups = (half.chunk(tp_size) for half in tensor.chunk(2))
            pieces = [torch.cat([g, u]) for g, u in zip(gates, ups, strict=True)]
        else:
            pieces = tensor.chunk(tp_size)
        for shard, piece in zip(shards, pieces, strict=True):
            shard[name] = piece.contiguous()
    return shards


def merge_adapter(shards: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Inverse of `split_adapter`; replicated tensors are taken from rank 0."""
    merged = {}
    for name, first in shards[0].items():
        pieces = [shard[name] for shard in shards]
        if not is_sharded_adapter(name):
            merged[name] = first
        elif name.endswith(".lora_A"):
            merged[name] = torch.cat(pieces, dim=1)
        elif name.endswith(f"{FC1}.lora_B"):
            halves = [piece.chunk(2) for piece in pieces]
            merged[name] = torch.cat([h[0] for h in halves] + [h[1] for h in halves])
        else:
            merged[name] = torch.cat(pieces)
    return merged


def adapter_to_hf(adapter: Mapping[str, torch.Tensor], arch: DecoderArch) -> dict[str, torch.Tensor]:
    """A whole megatron adapter -> a peft adapter of the HF model with the same merged weights:
    each HF part of a fused module gets the module's A and its own rows of B (q/k/v rows
    un-interleaved by `split_qkv`, gate/up by halves), since (B A)'s rows for q are B_q A.
    Keys as peft saves them (`base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight`)."""
    hf = {}
    for name, a in adapter.items():
        if not name.endswith(".lora_A"):
            continue
        module_path = name.removesuffix(".lora_A")
        index, module = module_path.removeprefix("decoder.layers.").split(".", 1)
        b = adapter[f"{module_path}.lora_B"]
        b_parts = split_qkv(b, arch) if module == QKV else b.chunk(2) if module == FC1 else (b,)
        for part, b_part in zip(HF_PARTS[module], b_parts, strict=True):
            prefix = HF_ADAPTER_PREFIX.format(index) + part
            hf[f"{prefix}.lora_A.weight"], hf[f"{prefix}.lora_B.weight"] = a.clone(), b_part.contiguous()
    return hf


def adapter_from_hf(hf: Mapping[str, torch.Tensor], arch: DecoderArch, modules: list[str]) -> dict[str, torch.Tensor]:
    """Inverse of `adapter_to_hf` for the wrapped `modules` (e.g. `decoder.layers.0.mlp.linear_fc1`).
    The parts of a fused module must share one A (an adapter trained on the HF model, with its own
    A per projection, is not a megatron adapter): otherwise a one-line ValueError."""
    adapter: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    for module_path in modules:
        index, module = module_path.removeprefix("decoder.layers.").split(".", 1)
        prefixes = [HF_ADAPTER_PREFIX.format(index) + part for part in HF_PARTS[module]]
        missing = [p for p in prefixes if f"{p}.lora_A.weight" not in hf]
        if missing:
            raise ValueError(f"saved adapter has no {missing[0].removeprefix('base_model.model.')}")
        a_parts = [hf[f"{p}.lora_A.weight"] for p in prefixes]
        if any(not torch.equal(a, a_parts[0]) for a in a_parts[1:]):
            raise ValueError(
                f"saved adapter has different A matrices for the parts of {module_path} "
                "(not saved by the megatron strategy): megatron adapts the fused layer"
            )
        b_parts = [hf[f"{p}.lora_B.weight"] for p in prefixes]
        used.update(f"{p}.lora_{kind}.weight" for p in prefixes for kind in "AB")
        adapter[f"{module_path}.lora_A"] = a_parts[0]
        if module == QKV:
            q, k, v = b_parts  # HF_PARTS[QKV]: q_proj, k_proj, v_proj
            adapter[f"{module_path}.lora_B"] = fuse_qkv(q, k, v, arch)
        else:
            adapter[f"{module_path}.lora_B"] = torch.cat(b_parts)
    if used != set(hf):
        raise ValueError(f"saved adapter does not fit the model: {sorted(set(hf) - used)[0]}")
    return adapter


def with_base_layer_names(state: Mapping[str, torch.Tensor], modules: list[str]) -> dict[str, torch.Tensor]:
    """A plain `GPTModel` state dict with the tensors of the wrapped `modules` renamed to their
    `base_layer` (`X.weight` -> `X.base_layer.weight`), as the wrapped model names them."""
    wrapped = set(modules)
    renamed = {}
    for name, value in state.items():
        module, param = name.rsplit(".", 1)
        renamed[f"{module}.base_layer.{param}" if module in wrapped else name] = value
    return renamed


def hf_target_modules(modules: list[str]) -> list[str]:
    """The HF module names (peft's `target_modules`) a saved adapter of these wrapped modules covers."""
    kinds = {path.removeprefix("decoder.layers.").split(".", 1)[1] for path in modules}
    return sorted(part.rsplit(".", 1)[-1] for kind in kinds for part in HF_PARTS[kind])
