"""A streak of skipped (non-finite) updates stops the run with one clear line; a first step whose
trainer scores the engine's tokens differently warns with one."""

import pytest

from roll.distributed.workers.common import average_metrics
from roll.pipeline.failures.divergence import ENGINE_GAP_WARN, TrainingDiverged, engine_gap_warning, stop_if_diverged


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


def test_a_first_step_whose_trainer_disagrees_with_the_engine_warns():
    # the gap the VL actor showed when it left the images behind (0.25), and a bf16 engine's (0.01)
    warning = engine_gap_warning({"rollout/logprob_abs_diff": 0.25, "rollout/staleness_max": 0.0}, step=1)
    assert warning is not None and warning.startswith("step 1: the trainer's log-probs") and "0.25 nats" in warning
    assert "\n" not in warning
    assert engine_gap_warning({"rollout/logprob_abs_diff": 0.01, "rollout/staleness_max": 0.0}, step=1) is None
    assert engine_gap_warning({"rollout/logprob_abs_diff": ENGINE_GAP_WARN, "rollout/staleness_max": 0.0}, 1) is None
    # trajectories from older weights (async) differ by design
    assert engine_gap_warning({"rollout/logprob_abs_diff": 0.25, "rollout/staleness_max": 1.0}, step=1) is None
