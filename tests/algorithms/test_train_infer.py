"""ROLL's train_infer_correction (roll.algorithms.train_infer) against numbers derived by hand.

One row, five positions, response mask [0, 1, 1, 0, 1]: two segments (positions 1-2, a turn; and 4).
The engine gave every generated token probability 0.5; the trainer 1.0, 0.5 and 0.25. So the
token ratios are 2, 1, 0.5 (log-ratios ln2, 0, -ln2) and the probability differences 0.5, 0, -0.25.
- segment: first turn exp((ln2 + 0) / 2) = sqrt 2, diff (0.5 + 0) / 2 = 0.25; second 0.5, -0.25
- geometric: exp((ln2 + 0 - ln2) / 3) = 1, diff (0.5 + 0 - 0.25) / 3 = 1/12
- sequence: exp(ln2 + 0 - ln2) = 1, diff 0.25
"""

import math

import pytest
import torch

from roll.algorithms.train_infer import ratios_and_diffs, segment_mean, train_infer_correction

MASK = torch.tensor([[0.0, 1, 1, 0, 1]])
INFER = torch.full((1, 5), math.log(0.5))
OLD = torch.tensor([[0.0, math.log(1.0), math.log(0.5), 0.0, math.log(0.25)]])
R = [1, 2, 4]


def at(x):
    return [round(float(v), 5) for v in x[0, R]]


def test_every_level_of_ratio_and_diff():
    s = ratios_and_diffs(OLD, INFER, MASK)
    assert at(s["ratio"]["token"]) == [2.0, 1.0, 0.5]
    assert at(s["ratio"]["segment"]) == [round(math.sqrt(2), 5)] * 2 + [0.5]
    assert at(s["ratio"]["geometric"]) == [1.0] * 3 and at(s["ratio"]["sequence"]) == [1.0] * 3
    assert at(s["diff"]["token"]) == [0.5, 0.0, -0.25]
    assert at(s["diff"]["segment"]) == [0.25, 0.25, -0.25]
    assert at(s["diff"]["geometric"]) == [round(1 / 12, 5)] * 3 and at(s["diff"]["sequence"]) == [0.25] * 3


def test_segment_mean_keeps_rows_and_runs_apart():
    values = torch.tensor([[1.0, 2, 3, 4, 5, 6], [10, 20, 30, 40, 50, 60]])
    mask = torch.tensor([[1.0, 1, 0, 1, 1, 1], [0, 0, 1, 0, 0, 1]])
    assert segment_mean(values, mask).tolist() == [[1.5, 1.5, 0, 5, 5, 5], [0, 0, 30, 0, 0, 60]]


def test_a_segment_ends_where_the_policy_version_changes():
    """Partial rollout: a turn continued under new weights is two segments, one per version."""
    values = torch.tensor([[1.0, 2, 3, 4, 5, 6]])
    mask = torch.tensor([[1.0, 1, 1, 1, 0, 1]])
    versions = torch.tensor([[3, 3, 4, 4, -1, 4]])  # a turn of versions 3 then 4; another turn of 4
    assert segment_mean(values, mask, versions).tolist() == [[1.5, 1.5, 3.5, 3.5, 0, 6]]
    assert segment_mean(values, mask).tolist() == [[2.5, 2.5, 2.5, 2.5, 0, 6]]
    # the row of the module docstring with its first turn split after position 1: ln2 and 0 apart
    split = torch.tensor([[-1, 5, 6, -1, 6]])
    s = ratios_and_diffs(OLD, INFER, MASK, split)
    assert at(s["ratio"]["segment"]) == [2.0, 1.0, 0.5] and at(s["diff"]["segment"]) == [0.5, 0.0, -0.25]
    _, keep, _ = train_infer_correction(
        OLD,
        INFER,
        MASK,
        is_weight=None,
        filters=[dict(agg_type="segment", ratio_enabled=True, ratio_low=0.9, ratio_high=1.1, diff_enabled=False)],
        versions=split,
    )
    assert at(keep) == [0.0, 1.0, 0.0]  # only the version-6 token of the first turn is kept


def test_is_weight_is_clamped_at_the_upper_bound_and_counts_what_it_clipped():
    weights, keep, metrics = train_infer_correction(
        OLD, INFER, MASK, is_weight={"weight_type": "token", "upper_bound": 1.2}, filters=[]
    )
    assert at(weights) == [1.2, 1.0, 0.5]
    assert keep.tolist() == [[1.0] * 5] and metrics["actor/is_weight_clipfrac"] == pytest.approx(1 / 3)
    assert metrics["actor/train_infer_ratio_token_mean"] == pytest.approx((2 + 1 + 0.5) / 3)
    assert "actor/train_infer_final_mask_mean" not in metrics


def test_filters_multiply_into_one_keep_mask():
    token_rule = {
        "agg_type": "token",
        "ratio_enabled": True,
        "ratio_low": 0.8,
        "ratio_high": 1.05,
        "diff_enabled": True,
        "diff_low": -0.1,
        "diff_high": 0.1,
    }
    weights, keep, metrics = train_infer_correction(OLD, INFER, MASK, is_weight=None, filters=[token_rule])
    assert weights is None and at(keep) == [0.0, 1.0, 0.0]  # only the token with ratio 1 and diff 0
    assert metrics["actor/train_infer_token_ratio_mask_mean"] == pytest.approx(1 / 3)
    assert metrics["actor/train_infer_token_diff_mask_mean"] == pytest.approx(1 / 3)  # 0.5 and -0.25 fail
    assert metrics["actor/train_infer_final_mask_mean"] == pytest.approx(1 / 3)
    # at the segment level the first turn (sqrt 2) fails as a whole, the second (0.5) too
    segment_rule = dict(token_rule, agg_type="segment", ratio_low=0.4, ratio_high=1.2, diff_enabled=False)
    _, keep, _ = train_infer_correction(OLD, INFER, MASK, is_weight=None, filters=[segment_rule])
    assert at(keep) == [0.0, 0.0, 1.0]
