"""A streak of skipped (non-finite) updates stops the run with one clear line."""

import pytest

from roll.distributed.workers.common import average_metrics
from roll.pipeline.guards import TrainingDiverged, stop_if_diverged


def test_streak_below_the_limit_goes_on():
    stop_if_diverged({"actor/consecutive_skipped_steps": 2.0}, limit=3, step=5)
    stop_if_diverged({"actor/consecutive_skipped_steps": 99.0}, limit=0, step=5)  # 0: never stop


@pytest.mark.parametrize("role", ["actor", "critic"])
def test_streak_at_the_limit_stops_naming_the_role(role):
    with pytest.raises(TrainingDiverged) as err:
        stop_if_diverged({f"{role}/consecutive_skipped_steps": 3.0}, limit=3, step=7)
    assert str(err.value).startswith(f"step 7: the last 3 {role} updates had a non-finite loss")
    assert "\n" not in str(err.value)


def test_worker_metrics_keep_the_streak_after_the_last_step_not_its_mean():
    per_step = [
        {"actor/skipped_steps": 1.0, "actor/consecutive_skipped_steps": 4.0},
        {"actor/skipped_steps": 1.0, "actor/consecutive_skipped_steps": 5.0},
    ]
    metrics = average_metrics(per_step, summed=("actor/skipped_steps",), last=("actor/consecutive_skipped_steps",))
    assert metrics == {"actor/skipped_steps": 2.0, "actor/consecutive_skipped_steps": 5.0}
