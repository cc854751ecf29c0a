"""Masked reductions over per-token tensors, and packing of generated tokens.

Every per-token tensor in `roll.algorithms` is (B, T), aligned to token positions of the full
sequence, with `mask` (B, T) equal to 1.0 exactly where the policy generated the token. Prompt,
observation and padding positions must not move a statistic, so every reduction here weighs by
the mask instead of averaging the whole tensor.

`compress` / `scatter` move the generated tokens of each row to the left and back. A multi-turn
row interleaves generated and observation tokens; recursions that run "from one generated token to
the next" (GAE, reward-to-go) are plain left-to-right recursions on the packed tensor.
"""

from __future__ import annotations

import torch
from torch import Tensor

# Divides an empty sum by a tiny number instead of zero: 0 / _TINY = 0, never NaN.
_TINY = 1e-8


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of `x` where `mask` is 1; over everything when `dim` is None, else along `dim`."""
    if dim is None:
        return (x * mask).sum()
    return (x * mask).sum(dim=dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `x` over positions where `mask` is 1. An empty mask gives 0, not NaN.

    x, mask: same shape, e.g. (B, T). dim None -> scalar; dim=-1 -> (B,) per-row means.
    """
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(x, mask, dim) / count.clamp_min(_TINY)


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of `x` over all positions where `mask` is 1 (a scalar).

    `unbiased` applies Bessel's correction n / (n - 1), which needs at least two masked entries;
    fewer raises ValueError rather than returning inf or NaN silently.
    """
    count = mask.sum()
    if count < 1 or (unbiased and count < 2):
        need = 2 if unbiased else 1
        raise ValueError(f"masked_var needs at least {need} masked entries, got {float(count):g}")
    centered = x - masked_mean(x, mask)
    variance = masked_mean(centered * centered, mask)
    if unbiased:
        variance = variance * count / (count - 1)
    return variance


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """(x - mean) / sqrt(var + eps) with mean and unbiased var over masked positions.

    `shift_mean=False` rescales only and keeps the original mean (used for rewards, whose sign
    carries meaning). Unmasked positions are set to 0 so they carry no advantage downstream.
    x, mask: (B, T) -> (B, T).
    """
    mean = masked_mean(x, mask)
    whitened = (x - mean) * torch.rsqrt(masked_var(x, mask) + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * mask


def compress(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Pack each row's masked entries to the left, keeping their order.

    x, mask: (B, T). Returns `packed` (B, L), `packed_mask` (B, L) and `index` (B, L), where L is
    the largest number of masked entries in a row, packed[b, j] = x[b, index[b, j]] for the j-th
    masked position of row b, and packed / packed_mask are 0 past a row's own count.
    """
    is_masked = mask > 0
    # Stable sort puts masked positions first, each group in its original order.
    order = torch.argsort((~is_masked).to(torch.int32), dim=1, stable=True)
    length = int(is_masked.sum(dim=1).max()) if x.shape[0] > 0 else 0
    index = order[:, :length]
    packed_mask = is_masked.gather(1, index).to(x.dtype)
    packed = x.gather(1, index) * packed_mask
    return packed, packed_mask, index


def scatter(packed: Tensor, index: Tensor, length: int) -> Tensor:
    """Inverse of `compress`: put packed (B, L) back at `index` in a zero (B, length) tensor.

    Slots of `packed` past a row's count must be 0 (as `compress` leaves them): they land on
    unmasked positions, which stay 0.
    """
    out = packed.new_zeros(packed.shape[0], length)
    return out.scatter(1, index, packed)


def reverse_discounted_cumsum(x: Tensor, discount: float) -> Tensor:
    """out[:, t] = x[:, t] + discount * out[:, t + 1], with out = 0 past the end. x: (B, L).

    Loops over contiguous columns and stacks once: writing out[:, t] in the loop is several
    times slower (strided copies), and L reaches thousands of tokens in multi-turn rows.
    """
    running = x.new_zeros(x.shape[0])
    reversed_out = []
    for column in reversed(x.T.contiguous().unbind(0)):
        running = torch.add(column, running, alpha=discount)
        reversed_out.append(running)
    if not reversed_out:
        return torch.zeros_like(x)
    return torch.stack(reversed_out[::-1], dim=1)


def dense_codes(ids) -> Tensor:
    """Any hashable ids (a sequence, or a 1-D tensor) -> dense ints 0..G-1 (B,), so that groups
    become scatter indices. Sequences number groups in order of first appearance; tensors in
    sorted order (torch.unique)."""
    if isinstance(ids, Tensor):
        return torch.unique(ids, return_inverse=True)[1]
    dense: dict = {}
    return torch.tensor([dense.setdefault(value, len(dense)) for value in ids], dtype=torch.long)
