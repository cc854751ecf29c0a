"""ROLL's batch_adjust_mode (roll.algorithms.batch_adjust), case by case as ROLL's adjust_batch reads."""

from __future__ import annotations

import numpy as np
import pytest

from roll.algorithms.batch_adjust import MODES, adjusted_rows, rows_divisor


def rows(batch_size: int, divisor: int, mode: str, seed: int = 0) -> np.ndarray:
    return adjusted_rows(batch_size, divisor, mode, np.random.default_rng(seed))


@pytest.mark.parametrize("mode", MODES)
def test_a_whole_number_of_mini_batches_is_left_alone(mode):
    assert rows(8, 4, mode).tolist() == list(range(8))


def test_copy_appends_distinct_rows_up_to_the_next_multiple():
    """10 rows, divisor 4: remainder 2, so 4 - 2 = 2 copies, drawn without replacement."""
    got = rows(10, 4, "copy")
    assert len(got) == 12 and got[:10].tolist() == list(range(10))
    assert len(set(got[10:].tolist())) == 2


def test_copy_draws_with_replacement_when_the_batch_is_too_small():
    """2 rows, divisor 8: 6 copies of 2 rows (ROLL: replace=True when to_add > batch_size)."""
    got = rows(2, 8, "copy")
    assert len(got) == 8 and got[:2].tolist() == [0, 1] and set(got[2:].tolist()) <= {0, 1}


def test_delete_drops_the_remainder_keeping_order():
    """10 rows, divisor 4: 2 rows go, 8 stay in their order, none twice."""
    got = rows(10, 4, "delete")
    assert len(got) == 8 and got.tolist() == sorted(set(got.tolist()))


@pytest.mark.parametrize("mode", ["delete", "random_sample", "auto"])
def test_a_batch_smaller_than_the_divisor_is_copied_up(mode):
    """3 rows, divisor 4: deleting 3 would leave none, so every mode copies one row."""
    got = rows(3, 4, mode)
    assert len(got) == 4 and got[:3].tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    "batch_size, divisor, want",
    [
        (10, 4, 8),  # remainder 2 < 5 (half the batch): delete
        (7, 4, 4),  # remainder 3 < 3.5: delete
        (12, 8, 8),  # remainder 4 < 6: delete
    ],
)
def test_auto_deletes_unless_the_batch_is_smaller_than_the_divisor(batch_size, divisor, want):
    """ROLL's copy condition, remainder >= half the batch, never holds for a batch of at least one
    divisor (rows = q * divisor + r with q >= 1 and r < divisor): auto copies only smaller batches."""
    assert len(rows(batch_size, divisor, "auto")) == want


def test_random_sample_keeps_exactly_one_divisor_of_rows():
    """ROLL keeps `divisor` rows (not the largest multiple): 10 rows, divisor 4 -> 4 rows."""
    got = rows(10, 4, "random_sample")
    assert len(got) == 4 and got.tolist() == sorted(set(got.tolist()))


def test_the_draws_follow_the_generator():
    assert rows(10, 4, "copy", seed=1).tolist() == rows(10, 4, "copy", seed=1).tolist()
    draws = {tuple(rows(10, 4, "delete", seed=s).tolist()) for s in range(5)}
    assert len(draws) > 1


def test_divisor_and_bad_mode():
    assert rows_divisor([8, 2, 6]) == 24 and rows_divisor([]) == 1
    with pytest.raises(ValueError, match="batch_adjust_mode 'pad' is not one of copy, delete, auto, random_sample"):
        rows(10, 4, "pad")
