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

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from roll.core.records import GenerateOutput, GenerateRequest
from roll.distributed.strategies.engine_api import Suspended
from roll.distributed.strategies.hf.device_sampling import SamplingState, sample
from roll.distributed.strategies.hf.kv_cache import Chunk, Prefix, cache_kv, row_chunk
from roll.distributed.strategies.hf.prefill import build_prefill
from roll.distributed.strategies.hf.static_decode import DecodeSlots, bucket, columns_for

if TYPE_CHECKING:
    from transformers import PreTrainedModel

POOL_SIZE = 6  # DecodeSlots kept between calls (each holds a KV cache and its captured graphs)
SHRINK_BELOW = 4  # move the rows to slots a quarter the size once they fill less than that


@dataclass
class SlotRow:
    """One request being decoded (in a slot, or a row of the dynamic continuous batch)."""

    request: GenerateRequest
    prefix: Prefix
    stop_ids: frozenset[int]
    width: int = 0  # the slot column of its first generated id (its prefill's width)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None

    @property
    def truncates(self) -> bool:
        return SamplingState.truncates([self.request])

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
        assert self.finish is not None, "the answer of a row still running"  # record() said it is done
        return GenerateOutput(self.request.request_id, self.token_ids, self.logprobs, self.finish, version)


class SlotPool:
    """The engine's DecodeSlots between calls, least recently used first."""

    def __init__(self) -> None:
        self.entries: list[DecodeSlots] = []

    def fitting(self, model: PreTrainedModel, rows: int, length: int) -> DecodeSlots:
        """Kept slots, all free, with room for `rows` rows of `length` columns and at most twice
        that (a step costs in proportion to both); or new ones."""
        size, columns = bucket(rows), columns_for(length)
        fits = [s for s in self.entries if size <= s.size <= 2 * size and columns <= s.length <= 2 * columns]
        slots = min(fits, key=lambda s: s.size * s.length) if fits else DecodeSlots(model, size, columns)
        slots.release([i for i in range(slots.size) if i not in slots.free])
        self._touch(slots)
        return slots

    def resize(self, slots: DecodeSlots, keep: list[int], rows: int, length: int) -> DecodeSlots:
        """The rows of slots `keep` moved, in that order, to slots sized for `rows` x `length`:
        kept ones if some fit exactly, else new ones."""
        size, columns = bucket(rows), max(columns_for(length), slots.length)
        kept = [s for s in self.entries if s is not slots and s.size == size and s.length == columns]
        target = kept[0] if kept else DecodeSlots(slots.model, size, columns, slots.use_graphs)
        target.take_rows(slots, keep)
        self._touch(target)
        return target

    def clear(self) -> None:
        self.entries.clear()

    def _touch(self, slots: DecodeSlots) -> None:
        self.entries = [s for s in self.entries if s is not slots] + [slots]
        del self.entries[:-POOL_SIZE]


class _Run:
    """One serve call: the rows by slot, the slots they live in, and the steps in flight."""

    def __init__(self, engine, deliver: Callable[[GenerateRequest, GenerateOutput], object]):
        self.engine, self.deliver = engine, deliver
        self.rows: dict[int, SlotRow] = {}
        self.slots: DecodeSlots | None = None
        self.truncate = False  # whether a running row asks for top-k / top-p

    def admit(self, requests: list[GenerateRequest]) -> None:
        """Prefill new requests in one chunk, sample their first token, put the live ones in slots."""
        engine = self.engine
        self.drain()  # a slot may be reused: every launched step's tokens go to the rows it ran for
        for r in requests:
            if r.params.max_new_tokens <= 0:
                self.deliver(r, GenerateOutput(r.request_id, [], [], "length", engine.policy_version))
        live = [r for r in requests if r.params.max_new_tokens > 0]
        if not live:
            return
        device = next(engine.model.parameters()).device
        prefixes = [engine.kv_cache.match(r.session_id, r.prompt_ids) for r in live]
        prefill = build_prefill(live, prefixes, engine.pad_token_id, device)
        engine.stats["prefix_tokens_reused"] += sum(p.length for p in prefixes)
        engine.stats["prefill_tokens"] += sum(prefill.new)
        logits = engine.prefill_forward(prefill)
        state = SamplingState.from_requests(live, logits.shape[-1], device)
        offsets = torch.tensor([r.sample_offset for r in live], dtype=torch.long, device=device)
        first, first_lp = sample(logits, state, offsets, SamplingState.truncates(live))
        eos = frozenset(engine.eos_token_ids)
        width = prefill.attention_mask.shape[1]
        rows = [SlotRow(r, p, r.params.stop_ids(eos), width) for r, p in zip(live, prefixes, strict=True)]
        layers = cache_kv(prefill.cache)
        keep = []
        for i, (row, tok, lp) in enumerate(zip(rows, first.tolist(), first_lp.tolist(), strict=True)):
            if row.record(tok, lp):
                self._store(row, functools.partial(row_chunk, layers, i, slice(width - prefill.new[i], width)))
                self.deliver(row.request, row.output(engine.policy_version))
            else:
                keep.append(i)
        if keep:
            self._place([rows[i] for i in keep], layers, prefill.attention_mask, first, keep)

    def _place(self, rows: list[SlotRow], layers, mask: torch.Tensor, first: torch.Tensor, keep: list[int]) -> None:
        need_rows = len(self.rows) + len(rows)
        need_length = mask.shape[1] + max(r.request.params.max_new_tokens for r in rows)
        pool = self.engine.slot_pool
        if self.slots is None:
            self.slots = pool.fitting(self.engine.model, need_rows, need_length)
        elif need_rows > self.slots.size or need_length > self.slots.length:
            self._move(need_rows, need_length)
        idx = torch.tensor(keep, device=mask.device)
        picked = [(k.index_select(0, idx), v.index_select(0, idx)) for k, v in layers]
        placed = self.slots.admit(
            [r.request for r in rows], picked, mask.index_select(0, idx), first.index_select(0, idx)
        )
        self.rows.update(zip(placed, rows, strict=True))
        self.truncate = any(row.truncates for row in self.rows.values())

    def _placed(self) -> DecodeSlots:
        """The slots of the running rows: made by the first `admit` that placed a row."""
        assert self.slots is not None, "no row was placed in slots yet"
        return self.slots

    def _move(self, rows: int, length: int) -> None:
        """Move the running rows to slots sized for `rows` x `length` (growing, or shrinking)."""
        keep = sorted(self.rows)
        self.slots = self.engine.slot_pool.resize(self._placed(), keep, rows, length)
        self.rows = {new: self.rows[old] for new, old in enumerate(keep)}

    def advance(self) -> None:
        """Launch steps until `depth` are in flight, then read the oldest one."""
        slots = self._placed()
        depth = 2 if slots.device.type == "cuda" else 1  # on a GPU the host reads step t during step t+1
        while slots.inflight < depth:
            self.engine.pace()
            slots.launch(self.truncate)
        self._read()
        if self.rows and len(self.rows) * SHRINK_BELOW <= slots.size and slots.size >= 8:
            self.drain()
            self._move(len(self.rows), slots.length)

    def drain(self) -> None:
        while self.slots is not None and self.slots.inflight:
            self._read()

    def suspend(self) -> list[Suspended]:
        """Every running row, unanswered, its slot freed (after the steps in flight are read)."""
        self.drain()
        rows, self.rows = self.rows, {}
        if self.slots is not None:
            self.slots.release(list(rows))
        return [Suspended(row.request, row.token_ids, row.logprobs) for row in rows.values()]

    def _read(self) -> None:
        """Take the oldest launched step's tokens; rows that are done leave their slots."""
        slots = self._placed()
        tokens, logprobs = slots.collect()
        if not self.rows:
            return
        self.engine.stats["decode_steps"] += 1
        done = [slot for slot, row in self.rows.items() if row.record(tokens[slot], logprobs[slot])]
        for slot in done:
            row = self.rows.pop(slot)
            end = row.width + len(row.token_ids) - 1  # its first id went in at `width`; the last was never fed
            self._store(row, functools.partial(slots.row_kv, slot, row.prefix.length, end))
            self.deliver(row.request, row.output(self.engine.policy_version))
        if done:
            slots.release(done)
            self.truncate = any(row.truncates for row in self.rows.values())

    def _store(self, row: SlotRow, new_chunk: Callable[[], Chunk]) -> None:
        """Keep the session's KV for the ids it fed: prompt + generated ids but the last. The KV is
        gathered (`new_chunk()`) only for a row of a session the cache keeps."""
        cache = self.engine.kv_cache
        if not cache.enabled or row.request.session_id is None:
            return
        cache.store(
            row.request.session_id, row.request.prompt_ids + row.token_ids[:-1], row.prefix.chunks + [new_chunk()]
        )


@torch.no_grad()
def serve_slots(
    engine,
    take: Callable[[int], list[GenerateRequest]],
    deliver: Callable[[GenerateRequest, GenerateOutput], object],
    max_rows: int,
    stop_admitting: Callable[[], bool],
    interrupt: Callable[[], bool] = lambda: False,
) -> list[Suspended]:
    """Decode until no row runs and `take` has nothing new (see the module docstring); returns the
    rows suspended once `interrupt()` is true, as `continuous.serve` does."""
    run = _Run(engine, deliver)
    while True:
        if run.rows and interrupt():
            suspended = run.suspend()  # rows done in the steps still in flight are answered first
            if suspended:
                return suspended
        room = max_rows - len(run.rows)
        joiners = take(room) if room > 0 and not stop_admitting() else []
        if joiners:
            if run.rows:
                engine.stats["joined_running"] += len(joiners)
            run.admit(joiners)
        if not run.rows:
            if joiners:
                continue
            run.drain()
            return []
        run.advance()
