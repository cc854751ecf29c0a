"""roll.core.padding: ragged rows to padded arrays, checked against hand-written arrays."""

from __future__ import annotations

import numpy as np
import pytest

from roll.core.padding import flat, length_mask, padded

ROWS = [[5, 6, 7], [8], []]


def test_right_and_left_padding():
    assert padded(ROWS, 4, 0, np.int64).tolist() == [[5, 6, 7, 0], [8, 0, 0, 0], [0, 0, 0, 0]]
    assert padded(ROWS, 4, -1, np.int64, left=True).tolist() == [[-1, 5, 6, 7], [-1, -1, -1, 8], [-1, -1, -1, -1]]
    out = padded([[0.5], [-1.25, 2.0]], 2, 0.0, np.float32)
    assert out.dtype == np.float32 and out.tolist() == [[0.5, 0.0], [-1.25, 2.0]]


def test_masks_match_the_padding():
    assert length_mask([3, 1, 0], 4).astype(int).tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]]
    assert length_mask([3, 1, 0], 4, left=True).astype(int).tolist() == [[0, 1, 1, 1], [0, 0, 0, 1], [0, 0, 0, 0]]
    assert length_mask([0, 0], 0).shape == (2, 0)


def test_a_row_too_long_or_a_count_that_disagrees_is_refused():
    with pytest.raises(ValueError, match="a row of 3 values does not fit a width of 2"):
        padded(ROWS, 2, 0, np.int64)
    with pytest.raises(ValueError, match="rows hold 4 values where their masks have 5 positions"):
        flat(ROWS, np.int64, 5)
