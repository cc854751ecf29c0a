"""`hf` inference strategy: a transformers causal LM driven by our own batched decode loop.

Contract: each request samples from its own seed (`device_sampling`: the k-th token draws the
uniform of (seed, k)), so the same seed gives the same tokens however requests are batched, up to
float round-off between batch shapes; why not `model.generate`: it draws every row from one global
RNG. Log-probs are those of `log_softmax(logits / T)`, what the trainer recomputes (top-k / top-p
truncation is not reflected, as in vLLM's default); greedy rows report `log_softmax(logits)`.

- Multi-turn prefix caching: a request with a `session_id` reuses the KV the engine kept of that
  session's earlier ids (`kv_cache.py`); each row is laid out [pad | reused KV | pad | new ids]
  with positions among its real ids, so its logits are those of a forward over the row alone.
- Decode runs on static slots (`static_decode.py`, `slot_serving.py`: a static KV cache per
  batch-size bucket, CUDA graphs on a GPU) where the architecture is supported, else on the
  dynamic-cache loop below; both give the same tokens up to round-off.
- Vision-language models (a `vision_config`) batch image requests a call at a time
  (`vl_generate.py`); their vision marker ids (`suppressed_token_ids`) are never sampled.
- A request may continue one that a weight update interrupted (partial rollout:
  `GenerateRequest.sample_offset`); `ignore_eos` requests stop only at their stop ids or length.

The layouts and the measurements: docs/engines/hf.md.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache

from roll.core.records import GenerateOutput, GenerateRequest
from roll.distributed.micro_batches import group_equal_rows
from roll.distributed.strategies.engine_api import decode_delay_s
from roll.distributed.strategies.hf import decode_attention
from roll.distributed.strategies.hf.device_sampling import RowSampler
from roll.distributed.strategies.hf.kv_cache import (
    DEFAULT_MAX_CACHED_TOKENS,
    Prefix,
    SessionKVCache,
    cache_kv,
    row_chunk,
)
from roll.distributed.strategies.hf.prefill import Prefill, build_prefill
from roll.distributed.strategies.hf.slot_serving import SlotPool, serve_slots
from roll.distributed.strategies.hf.static_decode import supports as slots_support
from roll.distributed.strategies.hf.vl_generate import generate_with_images
from roll.distributed.strategies.offload import move_module_, release_cached_memory

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class HFInferStrategy:
    def __init__(
        self,
        model: PreTrainedModel,
        pad_token_id: int,
        eos_token_ids: list[int],
        max_cached_tokens: int = DEFAULT_MAX_CACHED_TOKENS,
        static_decode: bool | None = None,
        suppressed_token_ids: Sequence[int] = (),
    ):
        """`static_decode`: decode on static slots (None: wherever the architecture supports it).
        `suppressed_token_ids`: ids never sampled by a vision-language model (its vision markers)."""
        self.model = model.eval()
        self.vision = getattr(model.config, "vision_config", None) is not None
        self.suppressed_token_ids = list(suppressed_token_ids)
        supported = slots_support(model)
        if static_decode and not supported:
            raise ValueError(f"static_decode: the {model.config.model_type!r} architecture is not supported")
        self.static_decode = supported if static_decode is None else static_decode
        if self.static_decode:
            decode_attention.use_on(model)  # single-token steps read the GQA cache once, not per query head
        self.slot_pool = SlotPool()
        self.device = next(model.parameters()).device  # where `reload` puts the model back
        self.pad_token_id = pad_token_id
        self.eos_token_ids = list(eos_token_ids)
        self.policy_version = 0
        self.decode_delay_s = decode_delay_s()
        self.kv_cache = SessionKVCache(max_cached_tokens)
        self.stats = {
            "prefix_tokens_reused": 0,
            "prefill_tokens": 0,
            "prefill_rows_computed": 0,
            "prefill_calls": 0,
            "decode_steps": 0,
            "joined_running": 0,
        }  # the last: continuous only

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """New weights make every cached key and value stale, so the session cache is cleared.
        The weights are copied into the parameters in place: captured decode graphs read them."""
        self.model.load_state_dict(state_dict, strict=False)
        self.policy_version = version
        self.kv_cache.clear()

    def pace(self) -> None:
        """Before a decode step: sleep `engine_api.DECODE_DELAY_VAR`'s delay, if one is set."""
        if self.decode_delay_s > 0:
            time.sleep(self.decode_delay_s)

    def release(self, session_id: str) -> bool:
        """Forget a finished conversation's KV; True if it was cached."""
        return self.kv_cache.release(session_id)

    def offload(self, to: str | torch.device = "cpu") -> None:
        """Free the device for a colocated role: drop every session's cached KV (device memory,
        and stale after the weight update that follows anyway) and move the model to `to`. The
        cache object with its bound, the policy version and the stats stay."""
        self.kv_cache.clear()
        self.slot_pool.clear()  # their graphs point at the parameters' device storage
        move_module_(self.model, to)
        release_cached_memory(self.device)

    def reload(self) -> None:
        """Move the model back to its device; sessions start caching afresh."""
        move_module_(self.model, self.device)

    @torch.no_grad()
    def generate_batch(self, requests: list[GenerateRequest]) -> list[GenerateOutput]:
        """Decode all requests together; each row stops on its own stop ids or length."""
        if self.vision:
            return generate_with_images(self, requests)
        if any(r.images is not None for r in requests):
            raise ValueError("a request carries images, but the model has no vision tower (config.vision_config)")
        if self.static_decode:
            return self._generate_on_slots(requests)
        device = next(self.model.parameters()).device
        prefixes = [self.kv_cache.match(r.session_id, r.prompt_ids) for r in requests]
        prefill = build_prefill(requests, prefixes, self.pad_token_id, device)
        self.stats["prefix_tokens_reused"] += sum(p.length for p in prefixes)
        self.stats["prefill_tokens"] += sum(prefill.new)
        out_ids, out_lps, finish = self._decode(requests, prefill)
        self._store_sessions(requests, prefixes, prefill, out_ids)
        return [
            GenerateOutput(r.request_id, out_ids[i], out_lps[i], finish[i], self.policy_version)
            for i, r in enumerate(requests)
        ]

    def _generate_on_slots(self, requests: list[GenerateRequest]) -> list[GenerateOutput]:
        """The slot loop fed every request at its first admission."""
        queue, answers = list(requests), {}

        def take(n: int) -> list[GenerateRequest]:
            taken, queue[:] = queue[:n], queue[n:]
            return taken

        def deliver(request: GenerateRequest, output: GenerateOutput) -> None:
            answers[id(request)] = output

        serve_slots(self, take, deliver, max(len(requests), 1), lambda: False)
        return [answers[id(r)] for r in requests]

    def _decode(self, requests: list[GenerateRequest], prefill: Prefill):
        """Prefill then one token per step for every unfinished row; grows `prefill.cache`.

        Returns per row (token ids, log-probs, finish reason).
        """
        n = len(requests)
        sampler = RowSampler(requests, prefill.input_ids.device, self.model.config.vocab_size)
        stop_sets = [r.params.stop_ids(self.eos_token_ids) for r in requests]
        max_new = [r.params.max_new_tokens for r in requests]
        out_ids: list[list[int]] = [[] for _ in range(n)]
        out_lps: list[list[float]] = [[] for _ in range(n)]
        finish = ["length"] * n
        active = [m > 0 for m in max_new]
        step_ids, attention_mask, position_ids = prefill.input_ids, prefill.attention_mask, prefill.position_ids
        for t in range(max(max_new, default=0)):
            if not any(active):
                break
            if t == 0:
                logits = self.prefill_forward(prefill)
            else:
                self.stats["decode_steps"] += 1
                self.pace()
                logits = (
                    self.model(
                        input_ids=step_ids,
                        attention_mask=attention_mask,
                        position_ids=position_ids,
                        past_key_values=prefill.cache,
                        use_cache=True,
                    )
                    .logits[:, -1, :]
                    .float()
                )
            tokens, logprobs = sampler.sample(logits)
            row_tokens, row_logprobs = tokens.tolist(), logprobs.tolist()  # one device sync a step, not 2n
            for i in range(n):
                if not active[i]:
                    continue
                tok = row_tokens[i]
                out_ids[i].append(tok)
                out_lps[i].append(row_logprobs[i])
                if tok in stop_sets[i]:
                    active[i], finish[i] = False, "stop"
                elif len(out_ids[i]) >= max_new[i]:
                    active[i] = False
            step_ids = tokens.view(n, 1)
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(n, 1)], dim=1)
            position_ids = position_ids[:, -1:] + 1
        return out_ids, out_lps, finish

    def prefill_forward(self, prefill: Prefill) -> torch.Tensor:
        """The first model call, over distinct rows only when no row reuses a cached prefix.

        Requests often repeat a prompt (the members of a group start from the same state, and
        step-wise prompts revisit states), so identical rows are computed once and their logits
        and KV copied to every row that asked; each row still samples with its own seed.
        Returns last-position logits (B, V).
        """
        rows = prefill.input_ids
        if prefill.attention_mask.shape[1] != rows.shape[1]:  # some rows reuse a cached prefix
            unique, inverse = rows, None
        else:
            unique, index, inverse = _distinct_rows(rows)
        self.stats["prefill_calls"] += 1
        out = self.model(
            input_ids=unique,
            attention_mask=prefill.attention_mask if inverse is None else prefill.attention_mask[index],
            position_ids=prefill.position_ids if inverse is None else prefill.position_ids[index],
            past_key_values=prefill.cache if inverse is None else DynamicCache(),
            use_cache=True,
            logits_to_keep=1,  # rows are left-padded: the last position is every row's last id
        )
        logits = out.logits[:, -1, :].float()
        if inverse is None:
            return logits
        layers = [
            (layer.keys.index_select(0, inverse), layer.values.index_select(0, inverse))
            for layer in out.past_key_values.layers
        ]
        prefill.cache = DynamicCache(layers)
        self.stats["prefill_rows_computed"] += len(unique)
        return logits.index_select(0, inverse)

    def _store_sessions(
        self, requests: list[GenerateRequest], prefixes: list[Prefix], prefill: Prefill, out_ids: list[list[int]]
    ) -> None:
        """Keep each session's KV for the ids it fed: prompt + generated ids but the last.

        The reused chunks are kept as they are; the new chunk is the row's KV from the batch cache,
        where row i holds its new ids at [P + N - m_i, P + N) and the generated ids it fed right
        after them.
        """
        if not self.kv_cache.enabled:
            return
        end_of_prompt = prefill.attention_mask.shape[1]  # P + N
        layers = cache_kv(prefill.cache)
        for i, r in enumerate(requests):
            if r.session_id is None or not out_ids[i]:
                continue
            fed = slice(end_of_prompt - prefill.new[i], end_of_prompt + len(out_ids[i]) - 1)
            self.kv_cache.store(
                r.session_id, r.prompt_ids + out_ids[i][:-1], prefixes[i].chunks + [row_chunk(layers, i, fed)]
            )


def _distinct_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(unique rows (U, N), index of each unique row's first occurrence (U,), inverse (B,))."""
    index, inverse = group_equal_rows(rows)
    return rows.index_select(0, index), index, inverse
