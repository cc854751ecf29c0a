"""Ragged lists of numbers -> one padded array, without a Python loop per row.

- `padded(seqs, width, fill, dtype, left=False)`: a (len(seqs), width) NumPy array whose row i
  holds seqs[i] at the start (right padding) or at the end (`left`), and `fill` elsewhere.
- `length_mask(lengths, width, left=False)`: the matching mask, 1 where row i has a value.
A row longer than `width` is an error. The batch builders (`roll.pipeline.phases.batch`) and the `hf`
engine's prefill use them.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np


def length_mask(lengths: Sequence[int] | np.ndarray, width: int, left: bool = False) -> np.ndarray:
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if lengths.size and lengths.max() > width:
        raise ValueError(f"a row of {lengths.max()} values does not fit a width of {width}")
    positions = np.arange(width)
    return positions >= width - lengths[:, None] if left else positions < lengths[:, None]


def padded(seqs: list, width: int, fill, dtype, left: bool = False) -> np.ndarray:
    lengths = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
    filled = length_mask(lengths, width, left)
    out = np.full((len(seqs), width), fill, dtype=dtype)
    out[filled] = flat(seqs, dtype, int(lengths.sum()))
    return out


def flat(seqs: list, dtype, count: int) -> np.ndarray:
    """The concatenation of `seqs` as one array; a total length other than `count` is an error."""
    values = np.fromiter(itertools.chain.from_iterable(seqs), dtype=dtype)
    if values.size != count:
        raise ValueError(f"rows hold {values.size} values where their masks have {count} positions")
    return values
