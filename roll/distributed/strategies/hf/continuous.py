"""Continuous batching for the `hf` engine: requests join a running decode batch between two
decode steps, and a row that finishes leaves at once.

The engine loop (`serve`) asks for new requests before every decode step. New requests are
prefilled together in a chunk of their own (with session prefix reuse and one prefill per distinct
prompt), sample their first token and join the running batch; then every running row feeds its
last token for one step. A row that stops is answered and leaves before the next step; its session
KV is stored as in the batch path. When a weight update waits and the worker interrupts (partial
rollout), `serve` returns before the next step with the running rows unanswered (`Suspended`).

Layout: the running rows share one `DynamicCache` (per layer (B, H_kv, W, D)) and an attention mask
(B, W) that is 1 on each row's real ids; a row joins left-padded with masked zero keys and values,
and position ids count each row's real ids, so a row's logits are those of a forward over the row
alone, up to float round-off. Columns no live row uses any more are cut off when rows leave. Each
row samples with its own seed and counter, so its tokens do not depend on its batch-mates.

Why not transformers' `ContinuousBatchingManager`: it samples with `torch.multinomial` on the global
RNG (a request's tokens would depend on its batch-mates and arrival time), and keeps its own paged
KV instead of our per-session cache that the env managers release by id.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from roll.core.records import GenerateOutput, GenerateRequest
from roll.distributed.strategies.engine_api import Suspended
from roll.distributed.strategies.hf.device_sampling import RowSampler
from roll.distributed.strategies.hf.infer import HFInferStrategy
from roll.distributed.strategies.hf.kv_cache import Chunk, cache_kv
from roll.distributed.strategies.hf.prefill import build_prefill
from roll.distributed.strategies.hf.slot_serving import SlotRow, serve_slots

Take = Callable[[int], list[GenerateRequest]]
"""`take(n)`: up to n requests that arrived since the last call (none: an empty list)."""
Deliver = Callable[[GenerateRequest, GenerateOutput], object]
"""`deliver(request, output)`: a finished request's answer, called as soon as its row stops."""


class RunningBatch:
    """Rows with their KV in one cache; each has sampled a token it has not fed yet (`last`)."""

    def __init__(self, rows: list[SlotRow], cache: DynamicCache, mask: torch.Tensor, last: torch.Tensor):
        self.rows = rows
        self.cache = cache
        self.mask = mask  # (B, W), 1 on the row's real ids
        self.last = last  # (B,)
        self._sampler: RowSampler | None = None

    @property
    def size(self) -> int:
        return len(self.rows)

    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return cache_kv(self.cache)

    def forward(self, model: torch.nn.Module) -> torch.Tensor:
        """Feed every row its last token at its next position (its count of real ids so far);
        returns next-token logits (B, V)."""
        positions = self.mask.sum(-1, keepdim=True)
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.size, 1)], dim=1)
        return (
            model(
                input_ids=self.last.view(-1, 1),
                attention_mask=self.mask,
                position_ids=positions,
                past_key_values=self.cache,
                use_cache=True,
            )
            .logits[:, -1, :]
            .float()
        )

    def sampler(self, vocab: int) -> RowSampler:
        if self._sampler is None:  # rows change only in `merge` / `keep`, which make a new batch
            self._sampler = RowSampler(
                [r.request for r in self.rows],
                self.mask.device,
                vocab,
                [r.request.sample_offset + len(r.token_ids) for r in self.rows],
            )
        return self._sampler

    def merge(self, other: RunningBatch) -> RunningBatch:
        """Both batches' rows, the narrower left-padded with masked zeros to the wider's width."""
        width = max(self.mask.shape[1], other.mask.shape[1])
        layers = [
            (
                torch.cat([_left_pad(k1, width, 2), _left_pad(k2, width, 2)]),
                torch.cat([_left_pad(v1, width, 2), _left_pad(v2, width, 2)]),
            )
            for (k1, v1), (k2, v2) in zip(self.layers(), other.layers(), strict=True)
        ]
        mask = torch.cat([_left_pad(self.mask, width, 1), _left_pad(other.mask, width, 1)])
        return RunningBatch(self.rows + other.rows, DynamicCache(layers), mask, torch.cat([self.last, other.last]))

    def keep(self, index: list[int]) -> RunningBatch | None:
        """The rows at `index` (None if none), without the leading columns none of them uses."""
        if not index:
            return None
        idx = torch.tensor(index, device=self.mask.device)
        mask = self.mask.index_select(0, idx)
        first = int(mask.any(0).nonzero()[0])
        layers = [
            (k.index_select(0, idx)[:, :, first:], v.index_select(0, idx)[:, :, first:]) for k, v in self.layers()
        ]
        return RunningBatch(
            [self.rows[i] for i in index], DynamicCache(layers), mask[:, first:], self.last.index_select(0, idx)
        )

    def row_kv(self, i: int, skip: int) -> Chunk:
        """Row i's keys and values at its real ids after the first `skip`, as a chunk of its own."""
        columns = self.mask[i].nonzero().squeeze(1)[skip:]
        return [
            (k[i][:, columns].transpose(0, 1).contiguous(), v[i][:, columns].transpose(0, 1).contiguous())
            for k, v in self.layers()
        ]


def _left_pad(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - t.shape[dim]
    if missing == 0:
        return t
    pad = [0, 0] * (t.dim() - 1 - dim) + [missing, 0]
    return F.pad(t, pad)


@torch.no_grad()
def serve(
    engine: HFInferStrategy,
    take: Take,
    deliver: Deliver,
    max_rows: int,
    stop_admitting: Callable[[], bool],
    interrupt: Callable[[], bool] = lambda: False,
) -> list[Suspended]:
    """Decode until no row runs and `take` has nothing new: before each decode step, admit up to
    `max_rows - running` new requests. Once `stop_admitting()` is true, no request is taken and
    the call returns when the running rows are done (a weight update or offload is waiting).
    Once `interrupt()` is true (partial rollout), the call returns before the next decode step,
    every running row unanswered: the returned `Suspended` rows, each with the ids it sampled so
    far (the last one not fed yet).

    Runs on the engine's thread; `take` and `deliver` are the inference worker's thread-safe
    hand-offs to and from its event loop. An engine on static decode slots runs `serve_slots`.
    """
    if engine.static_decode:
        return serve_slots(engine, take, deliver, max_rows, stop_admitting, interrupt)
    running: RunningBatch | None = None
    while True:
        if running is not None and interrupt():
            return [Suspended(r.request, r.token_ids, r.logprobs) for r in running.rows]
        room = max_rows - (running.size if running else 0)
        joiners = take(room) if room > 0 and not stop_admitting() else []
        if joiners:
            if running is not None:
                engine.stats["joined_running"] += len(joiners)
            joined = _admit(engine, joiners, deliver)
            if joined is not None:
                running = joined if running is None else running.merge(joined)
        if running is None:
            if joiners:
                continue
            return []
        engine.stats["decode_steps"] += 1
        engine.pace()
        running = _sample_and_retire(engine, running, running.forward(engine.model), deliver)


def _admit(engine: HFInferStrategy, requests: list[GenerateRequest], deliver: Deliver) -> RunningBatch | None:
    """Prefill new requests in one chunk and sample their first token; those already done leave."""
    live = []
    for r in requests:
        if r.params.max_new_tokens <= 0:
            deliver(r, GenerateOutput(r.request_id, [], [], "length", engine.policy_version))
        else:
            live.append(r)
    if not live:
        return None
    device = next(engine.model.parameters()).device
    prefixes = [engine.kv_cache.match(r.session_id, r.prompt_ids) for r in live]
    prefill = build_prefill(live, prefixes, engine.pad_token_id, device)
    engine.stats["prefix_tokens_reused"] += sum(p.length for p in prefixes)
    engine.stats["prefill_tokens"] += sum(prefill.new)
    logits = engine.prefill_forward(prefill)
    rows = [SlotRow(r, p, r.params.stop_ids(engine.eos_token_ids)) for r, p in zip(live, prefixes)]
    batch = RunningBatch(rows, prefill.cache, prefill.attention_mask, torch.zeros(len(rows), dtype=torch.long))
    return _sample_and_retire(engine, batch, logits, deliver)


def _sample_and_retire(
    engine: HFInferStrategy, batch: RunningBatch, logits: torch.Tensor, deliver: Deliver
) -> RunningBatch | None:
    """Sample each row's next token; answer the rows that are done and drop them from the batch."""
    tokens, logprobs = batch.sampler(logits.shape[-1]).sample(logits)
    batch.last = tokens
    done = [
        i for i, (row, tok, lp) in enumerate(zip(batch.rows, tokens.tolist(), logprobs.tolist())) if row.record(tok, lp)
    ]
    if not done:
        return batch
    for i in done:
        row = batch.rows[i]
        _store_session(engine, batch, i, row)
        deliver(
            row.request,
            row.output(engine.policy_version),
        )
    finished = set(done)
    return batch.keep([i for i in range(batch.size) if i not in finished])


def _store_session(engine: HFInferStrategy, batch: RunningBatch, i: int, row: SlotRow) -> None:
    """Keep the session's KV for the ids it fed (prompt + generated but the last), as the batch
    path does: the reused chunks as they are, plus the row's new columns."""
    if not engine.kv_cache.enabled or row.request.session_id is None:
        return
    engine.kv_cache.store(
        row.request.session_id,
        row.request.prompt_ids + row.token_ids[:-1],
        row.prefix.chunks + [batch.row_kv(i, row.prefix.length)],
    )
