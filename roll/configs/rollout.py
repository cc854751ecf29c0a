"""ROLL's rollout keys: a rollout-only run, trajectory dumps, and rollout dump/mock.

A config with `actor_infer` and no `actor_train` is a rollout-only run, ROLL's
`AgenticRolloutPipeline` (`examples/start_agentic_rollout_pipeline.py` there): `actor_infer` plays
`train_env_manager`'s envs for `max_steps` steps of `rollout_batch_size` trajectories and nothing
trains (`roll.pipeline.rollout_pipeline`). Every other top-level key the config sets is then
unused, as in ROLL, and `unused_in_rollout` names them so the run can say so.
"""

from __future__ import annotations

from typing import Literal

from roll.configs.base import ConfigModel

ROLLOUT_KEYS = frozenset(
    {
        "exp_name",
        "seed",
        "logging_dir",
        "output_dir",
        "render_save_dir",
        "trace_rollouts",
        "trace_samples_to_tensorboard",
        "trace_to_mlflow",
        "max_steps",
        "logging_steps",
        "overwrite_output_dir",
        "pretrain",
        "rollout_batch_size",
        "sequence_length",
        "ray_address",
        "actor_infer",
        "train_env_manager",
        "custom_envs",
        "system_envs",
        "track_with",
        "tracker_kwargs",
        "num_gpus_per_node",
        "rollout_dump_dir",
        "rollout_mock",
        "rpc_timeout",
        "env_monitor",
        "profiler_memory",
        "profiler_timeline",
    }
)
"""Top-level keys a rollout-only run reads."""


class RolloutMock(ConfigModel):
    """ROLL's `rollout_mock`: record each step's rollout, or replay a recording instead of rolling
    out (ROLL uses it to compare training runs on identical rollouts).

    "dump" writes the trajectories (and the causes of dropped ones) that a step's rollout returned to
    `dump_dir/train/step_NNNNNN.json` (`val/` for validations; N is roll's step: 1-based for
    training, 0 for the validation before training). "mock" reads them back instead of playing the
    envs: the run trains on exactly the recorded trajectories, engine log-probs included. A
    recording is roll's own (`roll.core.records.Trajectory` lists as JSON: loading it runs no
    code, unlike ROLL's pickles); ROLL's pickled DataProto batches do not load here."""

    enable: bool = False
    """Off by default, as in ROLL."""
    mode: Literal["dump", "mock"] = "dump"
    """"dump": record; "mock": replay (every step of the run must have been recorded)."""
    dump_dir: str = "./rollout_mock_dumps"
    """Where the recordings are (ROLL's default)."""

    @property
    def replays(self) -> bool:
        return self.enable and self.mode == "mock"

    @property
    def records(self) -> bool:
        return self.enable and self.mode == "dump"


def unused_in_rollout(set_keys: set[str], variables: set[str]) -> list[str]:
    """The keys among `set_keys` (those the config set) that a rollout-only run does not read,
    leaving out the env library's hydra `variables`."""
    return sorted(set_keys - ROLLOUT_KEYS - variables)
