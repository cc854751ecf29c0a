"""The project's errors carry the exit status and the line the CLI reports (roll.core.errors)."""

from __future__ import annotations

import signal

import pytest

from roll.agentic.rollout.scheduler import RolloutFailed
from roll.cli import Terminated
from roll.configs import ConfigError
from roll.core.errors import BadConfig, EngineFailed, RollError, RunStopped
from roll.distributed.placement import PlacementError
from roll.pipeline.checks.resources import NothingToTrain
from roll.pipeline.failures.disk_full import DiskFull
from roll.pipeline.failures.divergence import TrainingDiverged
from roll.pipeline.phases.checkpoint import CheckpointDamaged
from roll.pipeline.phases.recorded_rollout import RecordingMissing
from roll.pipeline.setup.cluster import ClusterError


@pytest.mark.parametrize(
    ("error", "status", "line"),
    [
        (ConfigError("max_steps", "must be >= 1"), 2, "config error: max_steps: must be >= 1"),
        (PlacementError("device_mapping", "needs 2 GPUs"), 2, "config error: device_mapping: needs 2 GPUs"),
        (
            CheckpointDamaged("resume_from_checkpoint: x is damaged"),
            2,
            "config error: resume_from_checkpoint: x is damaged",
        ),
        (ClusterError("no cluster at 1.2.3.4"), 2, "cluster error: no cluster at 1.2.3.4"),
        (NothingToTrain("already at max_steps"), 0, "already at max_steps"),
        (TrainingDiverged("actor: 3 skipped"), 1, "training stopped: actor: 3 skipped"),
        (RolloutFailed("rollout: x"), 1, "training stopped: rollout: x"),
        (EngineFailed("inference engine 'hf' failed"), 1, "training stopped: inference engine 'hf' failed"),
        (RecordingMissing("step 3"), 1, "training stopped: step 3"),
        (DiskFull("disk full"), 1, "training stopped: disk full"),
        (
            Terminated(signal.SIGTERM),
            143,
            "training stopped: SIGTERM; resume from the last checkpoint with resume_from_checkpoint=true",
        ),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else None,
)
def test_each_error_says_its_line_and_exit_status(error: RollError, status: int, line: str) -> None:
    assert isinstance(error, RollError)
    assert (error.exit_code, error.line()) == (status, line)


def test_errors_keep_their_builtin_bases() -> None:
    # code that catches RuntimeError / ValueError still catches them
    assert issubclass(EngineFailed, RuntimeError) and issubclass(RolloutFailed, RuntimeError)
    assert issubclass(PlacementError, ValueError) and issubclass(CheckpointDamaged, RuntimeError)
    assert issubclass(ConfigError, BadConfig) and issubclass(DiskFull, RunStopped)
