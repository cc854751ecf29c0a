"""benchmarks/learning/learning.py's reduction of seeds' curves, against hand-derived numbers."""

import pytest

from benchmarks.learning.learning import METRIC, Point, aggregate, curve, mean_ci95


def test_mean_ci95_uses_student_t():
    # values 0.2, 0.4, 0.6: mean 0.4, sample std 0.2, t(0.975, df=2) = 4.303 -> 4.303 * 0.2 / sqrt(3)
    mean, half = mean_ci95([0.2, 0.4, 0.6])
    assert mean == pytest.approx(0.4)
    assert half == pytest.approx(4.303 * 0.2 / 3**0.5)
    assert mean_ci95([0.7]) == (0.7, 0.0)


def test_curve_accumulates_wall_time_and_env_steps():
    records = [
        {"step": 0, "val/success": 0.0},
        {"step": 1, "time/step_s": 2.0, "train/num_actions": 4.0, "rollout/kept_trajectories": 8.0},
        {"step": 2, "time/step_s": 3.0, "train/num_actions": 2.5, "rollout/kept_trajectories": 8.0, "val/success": 0.5},
    ]
    assert curve(records) == [Point(0, 0.0, 0.0, 0.0), Point(2, 5.0, 52.0, 0.5)]


def test_curve_reads_the_env_metric():
    """WebShop's curve is its score; a record without that metric is no validation point."""
    records = [
        {"step": 0, "val/success": 0.0, "val/env/score": 0.125},
        {"step": 1, "time/step_s": 2.0},
        {"step": 2, "time/step_s": 3.0, "val/success": 0.0, "val/env/score": 0.4375},
        {"step": 3, "time/step_s": 1.0, "val/success": 1.0},
    ]
    assert METRIC["webshop"] == "val/env/score"
    assert curve(records, METRIC["webshop"]) == [Point(0, 0.0, 0.0, 0.125), Point(2, 5.0, 0.0, 0.4375)]


def test_aggregate_keeps_common_steps_and_averages_x():
    a = [Point(0, 0.0, 0.0, 0.0), Point(10, 20.0, 100.0, 0.5), Point(20, 40.0, 200.0, 0.7)]
    b = [Point(0, 0.0, 0.0, 0.0), Point(10, 30.0, 120.0, 0.3)]  # a shorter run ends the band at 10
    bands = aggregate([a, b])
    assert [band.step for band in bands] == [0, 10]
    last = bands[-1]
    # mean 0.4, std of (0.5, 0.3) = 0.1414, t(df=1) = 12.706 -> half width 12.706 * 0.1414 / sqrt(2) = 1.2706
    assert (last.wall_s, last.env_steps, last.mean) == pytest.approx((25.0, 110.0, 0.4))
    assert (last.low, last.high) == pytest.approx((0.4 - 1.2706, 0.4 + 1.2706))
    assert (last.minimum, last.maximum) == (0.3, 0.5)
