"""Sequence packing (ROLL's `use_sequence_packing`): a micro-batch's rows run as one row, no padding.

`PackedSequences(model)` is called like the model, `(input_ids, attention_mask) -> .logits`, on a
right-padded micro-batch (B, T): it concatenates the rows' real tokens into one sequence (1, N),
N = the sum of the row lengths, with `position_ids` restarting at 0 for every row, and runs the
model with no attention mask. Attention stays inside each row: a model that attends with sdpa
runs it row by row for the pass (roll.distributed.segment_attention: work sum L^2, not N^2);
otherwise transformers reads the position ids as packed sequences, with varlen kernels for flash
attention and a block-diagonal causal mask over the whole row for eager attention, and for sdpa
under gradient checkpointing. Logits come back in the padded layout (B, T, ...), zeros at
padding, so `shifted_values` and the losses are unchanged; `token_logprobs` takes the packed
logits instead (`packed_logits`, with the output head narrowed to the scored positions,
roll.distributed.output_head). Packed and padded passes give the same numbers up to float
round-off (tests/distributed/test_sequence_packing.py).
Compute is spent on the N real tokens only, instead of B x T.

`PackingBudget` is ROLL's `sequence_packing_args.algorithm: load_balance`: a micro-batch plan by
workload instead of rows. The number of micro-batches is ceil(total tokens / max packed length),
at least `min_micro_batches`, and rows go to them by the Karmarkar-Karp largest differencing method
over ROLL's FLOP proxy 24576 L + L^2 (`balanced_partitions`), as ROLL's LoadBalancePacker does.
The same partitioning with equal sizes spreads a mini-batch's rows over data-parallel ranks
(`balanced_rank_rows`), as ROLL's batch_balance does before training.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from roll.distributed.segment_attention import segment_attention, segment_kwargs, uses_segment_attention


def workload(length: int) -> int:
    """ROLL's FLOP proxy of one sequence (6 x hidden 4096 x L for the matmuls, L^2 for attention)."""
    return 24576 * length + length * length


class PackedSequences:
    """`model` run on packed rows (module docstring); every other attribute is the model's."""

    def __init__(self, model):
        self.model = model

    def __call__(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, use_cache: bool = False
    ) -> SimpleNamespace:
        """`use_cache` is accepted as HF models accept it; packed rows never keep a KV cache."""
        keep = self.kept(attention_mask)
        packed = self.packed_logits(input_ids, keep)  # (N, ...)
        logits = packed.new_zeros(*input_ids.shape, *packed.shape[1:])
        logits[keep] = packed
        return SimpleNamespace(logits=logits)

    @staticmethod
    def kept(attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, T) bool: the positions packed, each row's real tokens (right padding dropped)."""
        padding = attention_mask.bool().flip(1).int().argmax(1)  # trailing padding per row
        lengths = torch.where(attention_mask.bool().any(1), attention_mask.shape[1] - padding, 0)
        return torch.arange(attention_mask.shape[1], device=attention_mask.device)[None, :] < lengths[:, None]

    def packed_logits(self, input_ids: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """The model's logits (N, ...) on the packed row: the positions `keep` (B, T) marks (`kept`
        of the attention mask) in row-major order."""
        lengths = keep.sum(1)
        positions = torch.cat([torch.arange(int(n), device=input_ids.device) for n in lengths])
        inputs = {"input_ids": input_ids[keep][None], "position_ids": positions[None], "use_cache": False}
        if uses_segment_attention(self.model, int(lengths.max())):
            with segment_attention(self.model):
                out = self.model(**inputs, **segment_kwargs(lengths))
        else:
            out = self.model(**inputs)
        return out.logits[0]

    def __getattr__(self, name: str):
        return getattr(self.model, name)


@dataclass(frozen=True)
class PackingBudget:
    """ROLL's load_balance plan of packed micro-batches; `bins(lengths)` as `TokenBudget.bins`."""

    max_tokens: int
    """ROLL's `max_packed_sequence_length_train` / `_forward`: tokens per packed micro-batch, the
    target of the count (ROLL's plan balances workloads; a micro-batch may exceed it a little)."""
    min_micro_batches: int = 1
    """ROLL's `min_num_micro_batches_train` / `_forward`."""
    key: str = "max_packed_sequence_length"
    round_to: int = 1  # packed rows need no padding

    def bins(self, lengths: list[int]) -> list[list[int]]:
        """Row indices of each micro-batch, each list in row order, micro-batches by first row."""
        if lengths and max(lengths) > self.max_tokens:
            raise ValueError(f"{self.key}: {self.max_tokens} is smaller than one sequence ({max(lengths)} tokens)")
        count = max(math.ceil(sum(lengths) / self.max_tokens), self.min_micro_batches)
        count = max(1, min(count, len(lengths)))
        parts = balanced_partitions([workload(n) for n in lengths], count, equal_size=False)
        return sorted((sorted(p) for p in parts if p), key=lambda p: p[0])


def balanced_rank_rows(lengths: list[int], world_size: int) -> list[list[int]]:
    """Rows of each data-parallel rank, balanced by workload (ROLL's batch_balance): equal row
    counts when they divide evenly, else the Karmarkar-Karp split with unequal sizes."""
    equal = len(lengths) % world_size == 0
    parts = balanced_partitions([workload(n) for n in lengths], world_size, equal_size=equal)
    return sorted((sorted(p) for p in parts), key=lambda p: (not p, p[0] if p else 0))


def balanced_partitions(weights: list[int], k: int, equal_size: bool) -> list[list[int]]:
    """Karmarkar-Karp largest differencing: split indices of `weights` into `k` sets of near-equal
    sums (`equal_size`: each set len(weights) / k indices). Deterministic: ties by index."""
    if equal_size and len(weights) % k:
        raise ValueError(f"{len(weights)} items do not split into {k} equal sets")
    items = sorted((w, i) for i, w in enumerate(weights))
    heap: list[tuple[int, int, list[tuple[int, list[int]]]]] = []
    chunks = [items[s : s + k] for s in range(0, len(items), k)] if equal_size else [[item] for item in items]
    for order, chunk in enumerate(chunks):
        sets = sorted(([(w, [i]) for w, i in chunk] + [(0, [])] * (k - len(chunk))), key=_set_key, reverse=True)
        heapq.heappush(heap, (-(sets[0][0] - sets[-1][0]), order, sets))
    order = len(chunks)
    while len(heap) > 1:  # merge the two states of largest spread: biggest set with smallest set
        _, _, first = heapq.heappop(heap)
        _, _, second = heapq.heappop(heap)
        merged = [(a[0] + b[0], a[1] + b[1]) for a, b in zip(first, reversed(second), strict=True)]
        merged.sort(key=_set_key, reverse=True)
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), order, merged))
        order += 1
    return [indices for _, indices in heap[0][2]] if heap else [[] for _ in range(k)]


def _set_key(entry: tuple[int, list[int]]) -> tuple[int, int, tuple[int, ...]]:
    total, indices = entry
    return total, len(indices), tuple(sorted(indices, reverse=True))
