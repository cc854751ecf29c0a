"""Per-conversation KV cache of the `hf` engine (prefix caching across the turns of a session).

Why: generation is token in / token out, so every turn of a multi-turn conversation sends the
whole history, and without reuse the engine re-prefills all of it each turn. Here the engine keeps,
per session id, the ids it has already fed through the model (the prompt and the generated ids,
except the last sampled one, which was never fed) with their keys and values, and a later turn
feeds only what comes after the longest common prefix of its prompt and those ids.

Reusing any common prefix, not only the whole stored sequence, is exact: a causal model's keys and
values at position t depend on ids 0..t alone. A prompt that diverges early simply reuses less
(none if the first id differs). At least one prompt id is always left to feed, since the logits of
the next token come from feeding one.

Memory is bounded: sessions are evicted least-recently-used first until the stored ids number at
most `max_cached_tokens` (a token costs layers x 2 x kv_heads x head_dim x dtype bytes, e.g. 2 KiB
for the tiny model in float32, 12 KiB for Qwen2-0.5B in bfloat16). `max_cached_tokens=0` turns
reuse off. Keys and values cached under older weights are stale, so the engine clears the cache
on every weight update.

A session's KV is a list of chunks, one per turn, each owned by the session: a turn copies only the
KV of the ids it fed, not the whole history again. Batch-wide tensor work (one gather and one
scatter per layer) replaces per-row copies of whole histories, which on a few contended CPU cores
cost more than the prefill they save.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

DEFAULT_MAX_CACHED_TOKENS = 262_144  # tiny model: 2 KiB/token; a 0.5B bf16 model: ~12 KiB/token

LayerKV = tuple[torch.Tensor, torch.Tensor]
"""One layer's (keys, values) for one span of one sequence, each (T, H_kv, D)."""
Chunk = list[LayerKV]
"""One span of a session's ids, every layer."""


@dataclass
class Prefix:
    """What a session offers one prompt: the KV of its first `length` ids, as consecutive chunks.
    `images`: the keys of the images whose placeholders the session's ids hold (VL models)."""

    length: int = 0
    chunks: list[Chunk] = field(default_factory=list)
    images: tuple[str, ...] = ()

    def leading(self, n: int) -> Prefix:
        """The same prefix cut to its first n ids (n <= length)."""
        return Prefix(n, _leading(self.chunks, n), self.images) if n < self.length else self


@dataclass
class CachedSession:
    token_ids: list[int]  # the ids the engine fed for this session, in order
    chunks: list[Chunk]  # their KV; chunk lengths sum to len(token_ids)
    images: tuple[str, ...] = ()  # keys of the images among those ids, in order (VL models)


def common_prefix_length(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _leading(chunks: list[Chunk], n: int) -> list[Chunk]:
    """The chunks covering the first n ids; a chunk cut in two is copied, so that the part kept
    does not pin the memory of the part dropped."""
    kept = []
    for chunk in chunks:
        if n == 0:
            break
        size = chunk[0][0].shape[0]
        kept.append(chunk if size <= n else [(k[:n].clone(), v[:n].clone()) for k, v in chunk])
        n -= min(size, n)
    return kept


class SessionKVCache:
    """LRU map session id -> CachedSession, bounded by the total number of cached tokens.

    Thread-safe: the inference worker releases sessions from its event loop while the engine
    thread looks them up and stores them.
    """

    def __init__(self, max_cached_tokens: int = DEFAULT_MAX_CACHED_TOKENS):
        if max_cached_tokens < 0:
            raise ValueError(f"max_cached_tokens must be >= 0, got {max_cached_tokens}")
        self.max_cached_tokens = max_cached_tokens
        self._sessions: OrderedDict[str, CachedSession] = OrderedDict()
        self._num_tokens = 0
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.max_cached_tokens > 0

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    def __len__(self) -> int:
        return len(self._sessions)

    def session_ids(self) -> list[str]:
        """Cached sessions, least recently used first (the next to be evicted)."""
        with self._lock:
            return list(self._sessions)

    def match(self, session_id: str | None, prompt_ids: list[int]) -> Prefix:
        """The longest reusable prefix of `prompt_ids`, always shorter than the prompt."""
        if session_id is None:
            return Prefix()
        with self._lock:
            entry = self._sessions.get(session_id)
            if entry is None:
                return Prefix()
            self._sessions.move_to_end(session_id)
        n = common_prefix_length(entry.token_ids, prompt_ids[: len(prompt_ids) - 1])
        return Prefix(n, _leading(entry.chunks, n), entry.images)

    def store(self, session_id: str, token_ids: list[int], chunks: list[Chunk], images: tuple[str, ...] = ()) -> None:
        """Replace the session's entry and evict least-recently-used sessions over the bound.

        An entry larger than the whole bound is not kept (and evicts nothing).
        """
        with self._lock:
            self._pop(session_id)
            if len(token_ids) > self.max_cached_tokens:
                return
            self._sessions[session_id] = CachedSession(list(token_ids), chunks, tuple(images))
            self._num_tokens += len(token_ids)
            while self._num_tokens > self.max_cached_tokens:
                self._pop(next(iter(self._sessions)))

    def release(self, session_id: str) -> bool:
        """Drop a finished conversation; True if it was cached."""
        with self._lock:
            return self._pop(session_id)

    def clear(self) -> None:
        with self._lock:
            self._sessions.clear()
            self._num_tokens = 0

    def _pop(self, session_id: str) -> bool:
        entry = self._sessions.pop(session_id, None)
        if entry is not None:
            self._num_tokens -= len(entry.token_ids)
        return entry is not None


def left_padded_past(prefixes: list[Prefix]) -> list[LayerKV]:
    """The batch's past for one model call: per layer (keys, values), each (B, H_kv, P, D) with
    P the longest prefix; row i's KV is right-aligned and preceded by zeros (to be masked out)."""
    width = max(p.length for p in prefixes)
    rows = [(i, p) for i, p in enumerate(prefixes) if p.length]
    first = rows[0][1].chunks[0]
    dest = torch.cat([torch.arange((i + 1) * width - p.length, (i + 1) * width) for i, p in rows])
    dest = dest.to(first[0][0].device)
    past = []
    for layer in range(len(first)):
        pair = []
        for part in (0, 1):  # keys, values
            flat = torch.cat([chunk[layer][part] for _, p in rows for chunk in p.chunks])  # (sum n_i, H, D)
            padded = flat.new_zeros((len(prefixes) * width, *flat.shape[1:])).index_copy_(0, dest, flat)
            pair.append(padded.view(len(prefixes), width, *flat.shape[1:]).transpose(1, 2))
        past.append((pair[0], pair[1]))
    return past


def row_chunk(batch_layers: list[LayerKV], row: int, span: slice) -> Chunk:
    """Row `row`'s KV at positions `span` of a batch cache (per layer (B, H_kv, L, D)), copied into
    tensors of its own so that the batch's memory is not pinned."""
    return [
        (
            k[row, :, span].transpose(0, 1).clone(memory_format=torch.contiguous_format),
            v[row, :, span].transpose(0, 1).clone(memory_format=torch.contiguous_format),
        )
        for k, v in batch_layers
    ]


def cache_kv(cache: Cache) -> list[LayerKV]:
    """Per layer (keys, values) (B, H_kv, L, D) of a transformers cache a forward filled; the `hf`
    engine serves full-attention models only, whose every layer holds both."""
    out = []
    for layer in cache.layers:
        if not isinstance(layer, CacheLayerMixin) or layer.keys is None or layer.values is None:
            raise TypeError(f"a {type(layer).__name__} cache layer holds no keys and values (not full attention)")
        out.append((layer.keys, layer.values))
    return out
