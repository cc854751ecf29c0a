"""Sampling on the device with a random stream per request: counter-based uniforms.

A request's k-th token is drawn with the uniform `counter_uniform(seed, k)`: a pure function of its
own seed and of k, computed with integer tensor ops wherever the logits are. No generator object,
no global RNG and no host round trip is involved, so the tokens of a request never depend on its
batch-mates, on the batch's order or on the device's other work, and the whole step (temperature,
top-k / top-p, inverse-CDF draw, log-prob) can be replayed inside a CUDA graph.

The uniform is a 32-bit integer hash (the "lowbias"-style multiply-xorshift mixer with 27-bit
multipliers, so every product stays below 2**63 in int64 arithmetic) of the seed's two 32-bit
halves and the counter, keeping its top 24 bits: uniforms in [0, 1) on a grid of 2**-24.

Contract of `sample`: logits (B, V) -> tokens (B,), log-probs (B,) of the temperature-scaled full
distribution `log_softmax(logits / T)` (what the trainer recomputes; top-k / top-p truncation is not
reflected in them). Greedy rows take the argmax and report `log_softmax(logits)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from roll.core.records import GenerateRequest

_M32 = 0xFFFFFFFF
_MUL = 0x045D9F3B  # < 2**27: a 32-bit value times it stays below 2**59
_GOLDEN = 0x9E3779B9


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijective 32-bit mixer on int64 tensors holding values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = (x * _MUL) & _M32
    x = x ^ (x >> 16)
    x = (x * _MUL) & _M32
    return x ^ (x >> 16)


def counter_uniform(seeds: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """Uniforms in [0, 1) (float32), one per (seed, counter) pair; both int64 tensors of one shape.

    Seeds must be >= 0 (request seeds are); counters count a request's tokens from 0.
    """
    h = _mix32(seeds & _M32)
    h = _mix32(h ^ ((seeds >> 32) & _M32) ^ _GOLDEN)
    h = _mix32(h ^ (counters & _M32))
    return (h >> 8).to(torch.float32) * (1.0 / (1 << 24))


@dataclass
class SamplingState:
    """The per-row sampling settings as device tensors (one row per request or slot)."""

    greedy: torch.Tensor  # (B,) bool
    temperature: torch.Tensor  # (B, 1) float32; 1.0 on greedy rows
    top_k: torch.Tensor  # (B,) int64; the vocabulary size where a row has no top-k
    top_p: torch.Tensor  # (B, 1) float32
    seeds: torch.Tensor  # (B,) int64

    @staticmethod
    def from_requests(requests: list[GenerateRequest], vocab: int, device: torch.device) -> SamplingState:
        params = [r.params for r in requests]
        return SamplingState(
            greedy=torch.tensor([p.greedy for p in params], dtype=torch.bool, device=device),
            temperature=torch.tensor(
                [[1.0 if p.greedy else p.temperature] for p in params], dtype=torch.float32, device=device
            ),
            top_k=torch.tensor([min(p.top_k, vocab) if p.top_k > 0 else vocab for p in params], device=device),
            top_p=torch.tensor([[p.top_p] for p in params], dtype=torch.float32, device=device),
            seeds=torch.tensor([r.seed for r in requests], dtype=torch.int64, device=device),
        )

    @staticmethod
    def truncates(requests: list[GenerateRequest]) -> bool:
        """Whether any row asks for top-k or top-p (which costs a sort over the vocabulary)."""
        return any(r.params.top_k > 0 or r.params.top_p < 1.0 for r in requests)


def sample(
    logits: torch.Tensor, state: SamplingState, counters: torch.Tensor, truncate: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (B, V) -> (tokens (B,), log-probs (B,)); row i draws `counter_uniform(seed_i, counter_i)`.

    `truncate` applies every row's top-k then top-p; without it those settings are ignored (the
    caller passes `SamplingState.truncates`). Host-sync free: safe inside a CUDA graph.
    """
    logits = logits.float()
    scaled = logits / state.temperature
    logprobs_full = torch.log_softmax(scaled, dim=-1)
    kept = _truncate(scaled, state) if truncate else scaled
    cdf = kept.softmax(dim=-1).cumsum(dim=-1)
    u = counter_uniform(state.seeds, counters).unsqueeze(1)
    sampled = torch.searchsorted(cdf, u * cdf[:, -1:]).squeeze(1).clamp(max=logits.shape[-1] - 1)
    tokens = torch.where(state.greedy, logits.argmax(dim=-1), sampled)
    return tokens, logprobs_full.gather(1, tokens.unsqueeze(1)).squeeze(1)


def _truncate(scaled: torch.Tensor, state: SamplingState) -> torch.Tensor:
    """Top-k then top-p (nucleus) as -inf masks, in one sort; the first token is always kept."""
    sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
    kth = sorted_logits.gather(1, (state.top_k - 1).unsqueeze(1))
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    drop_sorted = (probs.cumsum(dim=-1) - probs) >= state.top_p
    drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
    return scaled.masked_fill(drop | (scaled < kth), float("-inf"))


def suppress(logits: torch.Tensor, token_ids: list[int]) -> torch.Tensor:
    """`logits` (..., V) with `token_ids` set to -inf: ids the model must never produce."""
    if not token_ids:
        return logits
    return logits.index_fill(-1, torch.tensor(token_ids, device=logits.device), float("-inf"))


class RowSampler:
    """Per-row temperature / top-k / top-p sampling for the dynamic-cache decode loops.

    Row i's k-th token is drawn with `counter_uniform(seed_i, k)` (`device_sampling`), the same
    stream the static decode slots use, so every path gives a request the same tokens.
    `counters` are the rows' indexes of the next token in their streams (default: each request's
    `sample_offset`); each `sample` advances them.
    """

    def __init__(
        self, requests: list[GenerateRequest], device: torch.device, vocab: int, counters: list[int] | None = None
    ):
        self.state = SamplingState.from_requests(requests, vocab, device)
        self.truncate = SamplingState.truncates(requests)
        if counters is None:
            counters = [r.sample_offset for r in requests]
        self.counters = torch.tensor(counters, dtype=torch.long, device=device)

    def sample(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """logits (N, V) -> (tokens (N,), logprobs (N,))."""
        tokens, logprobs = sample(logits, self.state, self.counters, self.truncate)
        self.counters += 1
        return tokens, logprobs
