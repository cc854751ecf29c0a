"""The `hf` engine's decode loop over static decode slots (`static_decode.DecodeSlots`), for both
batch-at-a-time calls and continuous batching.

`serve_slots(engine, take, deliver, max_rows, stop_admitting)` has the contract of
`continuous.serve`: before every decode step it admits up to `max_rows - running` new requests
(prefilled together, with the engine's session prefix reuse and one prefill per distinct prompt),
each row samples its first token from its prefill logits and joins a free slot, and a row that
stops is answered, has its session KV stored and leaves its slot at once. `generate_batch` is the
same loop fed all of its requests at the first admission.

Slots come from the engine's small pool of `DecodeSlots`, keyed by (slots, columns) in powers of two;
a run that needs more rows or columns than its slots have moves to a grown copy. On CUDA each
(slots, columns, truncation) step is captured once as a graph and replayed afterwards.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from roll.core.records import GenerateOutput, GenerateRequest
from roll.distributed.strategies.device_sampling import SamplingState, sample
from roll.distributed.strategies.kv_cache import Prefix, row_chunk
from roll.distributed.strategies.static_decode import MIN_LENGTH, DecodeSlots, bucket

POOL_SIZE = 3  # DecodeSlots kept between calls (each holds a KV cache and its captured graphs)


@dataclass
class SlotRow:
    """One request being decoded in a slot."""

    request: GenerateRequest
    prefix: Prefix
    stop_ids: frozenset[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None

    @property
    def truncates(self) -> bool:
        return self.request.params.top_k > 0 or self.request.params.top_p < 1.0

    def record(self, token: int, logprob: float) -> bool:
        """Append a sampled token; True once the row is done (a stop id, or its length)."""
        self.token_ids.append(token)
        self.logprobs.append(logprob)
        if token in self.stop_ids:
            self.finish = "stop"
        elif len(self.token_ids) >= self.request.params.max_new_tokens:
            self.finish = "length"
        return self.finish is not None

    def output(self, version: int) -> GenerateOutput:
        return GenerateOutput(self.request.request_id, self.token_ids, self.logprobs, self.finish, version)


class SlotPool:
    """The engine's DecodeSlots between calls, least recently used first."""

    def __init__(self):
        self.entries: list[DecodeSlots] = []

    def fitting(self, model: torch.nn.Module, rows: int, length: int) -> DecodeSlots:
        """The smallest kept slots with room for `rows` rows of `length` columns, all free; or new ones."""
        fits = [s for s in self.entries if s.size >= rows and s.length >= length]
        slots = min(fits, key=lambda s: s.size * s.length) if fits else None
        if slots is None:
            slots = DecodeSlots(model, bucket(rows), bucket(length, MIN_LENGTH))
        slots.release([i for i in range(slots.size) if i not in slots.free])
        self._touch(slots)
        return slots

    def grow(self, slots: DecodeSlots, rows: int, length: int) -> DecodeSlots:
        grown = slots.grown(bucket(rows), bucket(length, MIN_LENGTH))
        self.entries = [s for s in self.entries if s is not slots]
        self._touch(grown)
        return grown

    def clear(self) -> None:
        self.entries.clear()

    def _touch(self, slots: DecodeSlots) -> None:
        self.entries = [s for s in self.entries if s is not slots] + [slots]
        del self.entries[:-POOL_SIZE]


class _Run:
    """One serve call: the rows by slot and the slots they live in."""

    def __init__(self, engine, deliver: Callable[[GenerateRequest, GenerateOutput], None]):
        self.engine, self.deliver = engine, deliver
        self.rows: dict[int, SlotRow] = {}
        self.slots: DecodeSlots | None = None

    def admit(self, requests: list[GenerateRequest]) -> None:
        """Prefill new requests in one chunk, sample their first token, put the live ones in slots."""
        engine = self.engine
        live = [r for r in requests if r.params.max_new_tokens > 0 or self._answer_empty(r)]
        if not live:
            return
        from roll.distributed.strategies.hf_infer import build_prefill  # hf_infer imports this module

        device = next(engine.model.parameters()).device
        prefixes = [engine.kv_cache.match(r.session_id, r.prompt_ids) for r in live]
        prefill = build_prefill(live, prefixes, engine.pad_token_id, device)
        engine.stats["prefix_tokens_reused"] += sum(p.length for p in prefixes)
        engine.stats["prefill_tokens"] += sum(prefill.new)
        logits = engine.prefill_forward(prefill)
        state = SamplingState.from_requests(live, logits.shape[-1], device)
        zeros = torch.zeros(len(live), dtype=torch.long, device=device)
        first, first_lp = sample(logits, state, zeros, SamplingState.truncates(live))
        eos = frozenset(engine.eos_token_ids)
        rows = [SlotRow(r, p, eos | frozenset(r.params.stop_token_ids)) for r, p in zip(live, prefixes, strict=True)]
        keep = []
        layers = [(layer.keys, layer.values) for layer in prefill.cache.layers]
        width = prefill.attention_mask.shape[1]
        for i, (row, tok, lp) in enumerate(zip(rows, first.tolist(), first_lp.tolist(), strict=True)):
            if row.record(tok, lp):
                self._store(row, [row_chunk(layers, i, slice(width - prefill.new[i], width))])
                self.deliver(row.request, row.output(engine.policy_version))
            else:
                keep.append(i)
        if keep:
            self._place([rows[i] for i in keep], layers, prefill.attention_mask, first, keep)

    def _place(self, rows: list[SlotRow], layers, mask: torch.Tensor, first: torch.Tensor, keep: list[int]) -> None:
        width = mask.shape[1]
        need_rows = len(self.rows) + len(rows)
        need_length = width + max(r.request.params.max_new_tokens for r in rows)
        pool = self.engine.slot_pool
        if self.slots is None:
            self.slots = pool.fitting(self.engine.model, need_rows, need_length)
        elif need_rows > self.slots.size or need_length > self.slots.length:
            self.slots = pool.grow(self.slots, need_rows, need_length)
        idx = torch.tensor(keep, device=mask.device)
        picked = [(k.index_select(0, idx), v.index_select(0, idx)) for k, v in layers]
        placed = self.slots.admit(
            [r.request for r in rows], picked, mask.index_select(0, idx), first.index_select(0, idx)
        )
        self.rows.update(zip(placed, rows, strict=True))

    def step(self) -> None:
        """One decode step for every running row; rows that are done leave."""
        truncate = any(row.truncates for row in self.rows.values())
        tokens, logprobs = self.slots.step(truncate)
        self.engine.stats["decode_steps"] += 1
        done = [slot for slot, row in self.rows.items() if row.record(tokens[slot], logprobs[slot])]
        for slot in done:
            row = self.rows.pop(slot)
            self._store(row, [self.slots.row_kv(slot, row.prefix.length)])
            self.deliver(row.request, row.output(self.engine.policy_version))
        self.slots.release(done)

    def _answer_empty(self, request: GenerateRequest) -> bool:
        self.deliver(request, GenerateOutput(request.request_id, [], [], "length", self.engine.policy_version))
        return False

    def _store(self, row: SlotRow, new_chunks) -> None:
        """Keep the session's KV for the ids it fed: prompt + generated ids but the last."""
        cache = self.engine.kv_cache
        if not cache.enabled or row.request.session_id is None:
            return
        cache.store(row.request.session_id, row.request.prompt_ids + row.token_ids[:-1], row.prefix.chunks + new_chunks)


@torch.no_grad()
def serve_slots(
    engine,
    take: Callable[[int], list[GenerateRequest]],
    deliver: Callable[[GenerateRequest, GenerateOutput], None],
    max_rows: int,
    stop_admitting: Callable[[], bool],
) -> None:
    """Decode until no row runs and `take` has nothing new (see the module docstring)."""
    run = _Run(engine, deliver)
    while True:
        room = max_rows - len(run.rows)
        joiners = take(room) if room > 0 and not stop_admitting() else []
        if joiners:
            if run.rows:
                engine.stats["joined_running"] += len(joiners)
            run.admit(joiners)
        if not run.rows:
            if joiners:
                continue
            return
        run.step()
