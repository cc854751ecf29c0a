"""Decode slots of the `hf` engine: a static KV cache per batch-size bucket, one decode step as a
fixed-shape function, replayed as a CUDA graph on a GPU.

`DecodeSlots(model, slots=S, length=L)` owns per layer keys and values of shape (S, H_kv, L, D) and
the per-slot state of a decode step as device tensors: the id to feed, its position among the
row's real ids, the cache column it is written to, the attention mask (S, 1, 1, L) over the
columns, the row's sampling settings and its token counter. A row is admitted into a free slot
with the KV of its prefill (computed elsewhere, with session prefix reuse) and its first token;
`step()` then feeds every slot one token, writes its KV at the slot's column, samples the next
token on the device (`device_sampling.sample`) and advances the state, all with fixed shapes, so
on CUDA the step is captured once per (S, L, truncation) and replayed (after a few eager steps,
so that a generation of a handful of tokens never pays for a capture). `launch` starts a step and
`collect` returns the oldest launched step's tokens, so on a GPU the next step can run while the
host reads the last one (the step feeds itself: its sampled ids are the next step's input). The host reads one small
copy a step: the sampled tokens and their log-probs. Free slots compute garbage that nobody reads.

Rows are independent: a slot's logits are those of a forward over its row alone (up to float
round-off), and its tokens depend on its own seed and counter only. The caller keeps every live
row's column below L (`grow`) and the row count at most S.

The model is called with a prepared 4D mask (which transformers passes through as it is) and
a cache object whose `update` writes at the slots' columns, the two hooks of transformers'
decoder-only models that `generate` uses itself; `supports(model)` names the architectures checked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from roll.core.records import GenerateRequest
from roll.distributed.strategies.hf.device_sampling import SamplingState, sample

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE
    from transformers import PreTrainedModel

# Decoder-only families whose forward takes a prepared mask mapping and calls `cache.update`.
SUPPORTED_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral"})
ATTENTION_WITH_4D_MASKS = frozenset({"sdpa", "eager", "roll_sdpa"})  # flash attention takes no 4D mask
MIN_LENGTH = 128
LENGTH_STEP = 128  # columns come in multiples of this: attention reads every column of a slot
EAGER_STEPS = 4  # steps a DecodeSlots runs eagerly before it captures: short generations never pay a capture


def supports(model: PreTrainedModel) -> bool:
    """True for the architectures this path is written for, with full attention in every layer."""
    config = model.config
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    return (
        config.model_type in SUPPORTED_MODEL_TYPES
        and set(layer_types) == {"full_attention"}
        and config._attn_implementation in ATTENTION_WITH_4D_MASKS
    )


def bucket(n: int, minimum: int = 1) -> int:
    """The power of two at or above max(n, minimum): slot counts."""
    size = minimum
    while size < n:
        size *= 2
    return size


def columns_for(n: int) -> int:
    """The multiple of LENGTH_STEP at or above max(n, MIN_LENGTH): slot lengths."""
    return max(MIN_LENGTH, -(-n // LENGTH_STEP) * LENGTH_STEP)


class _SlotCache:
    """What the model's attention layers see as `past_key_values`: `update` writes the new key and
    value of each slot at that slot's column and returns the whole static cache of the layer."""

    def __init__(self, slots: DecodeSlots):
        self.slots = slots

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        s = self.slots
        index = s.column.view(-1, 1, 1, 1).expand(-1, key_states.shape[1], 1, key_states.shape[3])
        s.keys[layer_idx].scatter_(2, index, key_states)
        s.values[layer_idx].scatter_(2, index, value_states)
        return s.keys[layer_idx], s.values[layer_idx]


class DecodeSlots:
    def __init__(self, model: PreTrainedModel, slots: int, length: int, use_graphs: bool | None = None):
        param = next(model.parameters())
        self.model, self.device, self.size, self.length = model, param.device, slots, length
        config = model.config
        heads = config.num_key_value_heads or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        shape = (slots, heads, length, head_dim)
        self.keys = [torch.zeros(shape, dtype=param.dtype, device=self.device) for _ in range(config.num_hidden_layers)]
        self.values = [torch.zeros_like(k) for k in self.keys]
        zeros = torch.zeros(slots, dtype=torch.long, device=self.device)
        self.ids, self.positions, self.column, self.counters = (
            zeros.view(-1, 1).clone(),
            zeros.view(-1, 1).clone(),
            zeros.clone(),
            zeros.clone(),
        )
        self.mask = torch.zeros((slots, 1, 1, length), dtype=torch.bool, device=self.device)
        self.mask[:, :, :, 0] = True  # a free slot attends to one (zero) column: finite garbage, never NaN
        vocab = config.vocab_size
        self.vocab = vocab
        self.sampling = SamplingState(
            greedy=torch.ones(slots, dtype=torch.bool, device=self.device),
            temperature=torch.ones((slots, 1), device=self.device),
            top_k=torch.full((slots,), vocab, device=self.device),
            top_p=torch.ones((slots, 1), device=self.device),
            seeds=zeros.clone(),
        )
        self.free = list(range(slots))
        self.cache = _SlotCache(self)
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else use_graphs
        self._graphs: dict[bool, torch.cuda.CUDAGraph] = {}
        self.steps = 0
        # two host buffers of (tokens, log-probs): a step's results land in one while the host reads the other
        self._host = torch.empty((2, 2, slots), dtype=torch.float64, pin_memory=self.device.type == "cuda")
        # the step's (tokens, log-probs) in the host buffers' dtype, so the copy out is asynchronous
        self._out = torch.zeros((2, slots), dtype=torch.float64, device=self.device)
        self._pool: _POOL_HANDLE | None = None  # the memory pool of this slots' graphs (they live and die together)
        self._inflight: list[tuple[torch.Tensor, torch.cuda.Event | None]] = []

    # ---- admission and release (host side, between steps) ----

    def admit(
        self,
        requests: list[GenerateRequest],
        layers: list[tuple[torch.Tensor, torch.Tensor]],
        mask: torch.Tensor,
        first: torch.Tensor,
    ) -> list[int]:
        """Put prefilled rows into free slots; returns their slots.

        `layers`: per layer (keys, values) of the prefill, (B, H_kv, W, D); `mask` (B, W), 1 on real
        ids; `first` (B,) the token each row sampled from its prefill logits (the counter of a
        request's `sample_offset`).
        """
        width = mask.shape[1]
        assert len(requests) <= len(self.free) and width < self.length, "grow the slots first"
        slots = [self.free.pop(0) for _ in requests]
        idx = torch.tensor(slots, device=self.device)
        for (k, v), keys, values in zip(layers, self.keys, self.values, strict=True):
            keys[:, :, :width].index_copy_(0, idx, k.to(keys.dtype))
            values[:, :, :width].index_copy_(0, idx, v.to(values.dtype))
        row_mask = torch.zeros((len(slots), self.length), dtype=torch.bool, device=self.device)
        row_mask[:, :width] = mask.bool()
        self.mask.index_copy_(0, idx, row_mask.view(-1, 1, 1, self.length))
        self.ids.index_copy_(0, idx, first.view(-1, 1))
        self.positions.index_copy_(0, idx, mask.sum(-1, keepdim=True).long())
        self.column.index_fill_(0, idx, width)
        offsets = torch.tensor([r.sample_offset + 1 for r in requests], dtype=torch.long, device=self.device)
        self.counters.index_copy_(0, idx, offsets)
        new = SamplingState.from_requests(requests, self.vocab, self.device)
        for name in ("greedy", "temperature", "top_k", "top_p", "seeds"):
            getattr(self.sampling, name).index_copy_(0, idx, getattr(new, name))
        return slots

    def release(self, slots: list[int]) -> None:
        if not slots:
            return
        idx = torch.tensor(slots, device=self.device)
        self.mask.index_fill_(0, idx, False)
        self.mask[idx, 0, 0, 0] = True
        self.column.index_fill_(0, idx, 0)
        self.free.extend(slots)
        self.free.sort()

    def row_kv(self, slot: int, skip: int, end: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The slot's keys and values at its real ids in columns [0, end) after the first `skip`,
        each (n, H_kv, D), for the session cache (`end`: one past the last column the row fed)."""
        columns = self.mask[slot, 0, 0, :end].nonzero().squeeze(1)[skip:]
        return [
            (k[slot][:, columns].transpose(0, 1).contiguous(), v[slot][:, columns].transpose(0, 1).contiguous())
            for k, v in zip(self.keys, self.values, strict=True)
        ]

    def take_rows(self, source: DecodeSlots, keep: list[int]) -> None:
        """Hold the rows of `source`'s slots `keep`, in that order, in slots 0, 1, ...; every other
        slot free. Neither may have a step in flight; this one needs at least `source`'s columns."""
        assert not source.inflight and not self.inflight and self.length >= source.length and len(keep) <= self.size
        self.release([i for i in range(self.size) if i not in self.free])
        n, width = len(keep), source.length
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        for src, dst in ((source.keys, self.keys), (source.values, self.values)):
            for a, b in zip(src, dst, strict=True):
                b[:n, :, :width].copy_(a.index_select(0, idx))
        self.mask[:n].fill_(False)
        self.mask[:n, :, :, :width].copy_(source.mask.index_select(0, idx))
        for name in ("ids", "positions", "column", "counters"):
            getattr(self, name)[:n].copy_(getattr(source, name).index_select(0, idx))
        for name in ("greedy", "temperature", "top_k", "top_p", "seeds"):
            getattr(self.sampling, name)[:n].copy_(getattr(source.sampling, name).index_select(0, idx))
        self.free = list(range(n, self.size))

    # ---- the decode step ----

    def launch(self, truncate: bool) -> None:
        """Run one step for every slot and start copying its tokens and log-probs to the host; on
        CUDA this returns before the GPU is done, so the host can look at the previous step meanwhile."""
        self.steps += 1
        if self.use_graphs and self.steps > EAGER_STEPS:
            graph = self._graphs.get(truncate) or self._capture(truncate)
            graph.replay()
        else:
            self._step(truncate)
        buffer = self._host[self.steps % 2]
        buffer.copy_(self._out, non_blocking=True)  # same dtype into pinned memory: no host wait
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        self._inflight.append((buffer, event))

    def collect(self) -> tuple[list[int], list[float]]:
        """(tokens, log-probs) per slot of the oldest launched step, waiting for it if needed."""
        buffer, event = self._inflight.pop(0)
        if event is not None:
            event.synchronize()
        tokens, logprobs = buffer.tolist()
        return [int(t) for t in tokens], logprobs

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    def _step(self, truncate: bool) -> None:
        self.mask.scatter_(3, self.column.view(-1, 1, 1, 1), True)
        out = self.model(
            input_ids=self.ids,
            position_ids=self.positions,
            attention_mask=self.mask,  # 4D: the models take a prepared mask as it is
            past_key_values=self.cache,
            use_cache=True,
        )
        tokens, logprobs = sample(out.logits[:, -1, :], self.sampling, self.counters, truncate)
        self._out[0].copy_(tokens)
        self._out[1].copy_(logprobs)
        self.ids.copy_(tokens.view(-1, 1))
        self.positions.add_(1)
        self.column.add_(1).clamp_(max=self.length - 1)
        self.counters.add_(1)

    def _capture(self, truncate: bool) -> torch.cuda.CUDAGraph:
        """Warm the step up on a side stream, then capture it. The per-slot state is saved and
        restored around both, so capturing changes nothing that a later step reads: the keys and
        values they wrote sit at columns no mask has opened yet, and are overwritten first."""
        saved = [t.clone() for t in self._state_tensors()]
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._step(truncate)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            self._step(truncate)
        for tensor, value in zip(self._state_tensors(), saved, strict=True):
            tensor.copy_(value)
        self._graphs[truncate] = graph
        return graph

    def _state_tensors(self) -> list[torch.Tensor]:
        return [self.ids, self.positions, self.column, self.counters, self.mask]
