"""Dynamic batching: micro-batches by a token budget instead of a fixed number of rows (ROLL's
`use_dynamic_batching_in_train` / `_in_infer`).

Rows are sorted by length, longest first, and packed greedily: a micro-batch takes the next row
while its rows times its padded length (its longest row rounded up to a multiple of `round_to`)
stay within `max_tokens`. Short rows then travel many to a micro-batch and long rows few, so
little compute goes to padding, and no micro-batch holds more tokens than the budget (the memory
bound). Training losses do not change: `TorchTrainStrategy.train_step` weights every micro-batch
by its share of the mini-batch's response tokens (`roll.distributed.ranks.micro_weights`), so the
accumulated gradient is the mini-batch's whatever the split; forward outputs are put back in
batch order. Everything here is a pure function of row lengths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from tensordict import TensorDict

from roll.core.fields import Batch


@dataclass(frozen=True)
class TokenBudget:
    """At most `max_tokens` (rows x padded length) per micro-batch, lengths padded to a multiple
    of `round_to`; `key` is the config key named in errors."""

    max_tokens: int
    round_to: int = 1
    key: str = "max_tokens_per_microbatch"

    def bins(self, lengths: list[int]) -> list[list[int]]:
        """Row indices of each micro-batch (`bin_by_tokens`); a packing plan has the same method."""
        return bin_by_tokens(lengths, self)


def round_up(length: int, multiple: int) -> int:
    """Smallest multiple of `multiple` that is >= `length` (at least `multiple`)."""
    return max(1, -(-length // multiple)) * multiple


def bin_by_tokens(lengths: list[int], budget: TokenBudget) -> list[list[int]]:
    """Row indices of each micro-batch: longest rows first (ties in row order), packed greedily so
    that len(bin) * round_up(longest row of the bin) <= max_tokens. Every row is in one bin.
    A row that alone exceeds the budget: ValueError naming `budget.key`."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    padded = 0  # the current bin's padded length: its first (longest) row's
    for row in order:
        length = round_up(lengths[row], budget.round_to)
        if length > budget.max_tokens:
            raise ValueError(
                f"{budget.key}: {budget.max_tokens} is smaller than one sequence "
                f"({lengths[row]} tokens, {length} rounded to {budget.round_to})"
            )
        if bins and (len(bins[-1]) + 1) * padded <= budget.max_tokens:
            bins[-1].append(row)
        else:
            bins.append([row])
            padded = length
    return bins


def padding_fraction(lengths: list[int], bins: list[list[int]], round_to: int = 1) -> float:
    """Share of the tokens the model runs on that are padding, for micro-batches `bins`."""
    real = sum(lengths)
    computed = sum(len(b) * round_up(max(lengths[i] for i in b), round_to) for b in bins)
    return 1.0 - real / computed if computed else 0.0


def pad_to_multiple(micro: TensorDict, round_to: int) -> TensorDict:
    """Zero-pad every per-token (b, t) tensor of `micro` on the right to a multiple of `round_to`
    (attention and response masks 0 there, so no real token's output or loss changes)."""
    length = micro["attention_mask"].shape[1]
    target = round_up(length, round_to)
    if target == length:
        return micro
    # apply out of place returns a TensorDict (tensordict's stub adds None, the in-place result)
    padded = cast(
        TensorDict,
        micro.exclude(*Batch.IMAGE_KEYS).apply(
            lambda x: F.pad(x, (0, target - length)) if x.dim() >= 2 and x.shape[1] == length else x
        ),
    )
    return padded.update(micro.select(*(k for k in Batch.IMAGE_KEYS if k in micro.keys())))


def row_lengths(attention_mask: torch.Tensor) -> list[int]:
    """Tokens per row of a right-padded batch: the index after its last attended position."""
    attended = attention_mask.bool()
    positions = torch.arange(1, attended.shape[1] + 1, device=attended.device)
    return (attended * positions).amax(dim=1).tolist()
