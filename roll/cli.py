"""Command line entry: `--config_path DIR --config_name NAME [hydra overrides ...]`.

A bad config is the user's most common mistake, so it gets one line on stderr naming the key and
exit status 2 (no traceback). A run that cannot go on for a known reason (diverged training, a
rollout that keeps failing, a worker process that died for good) gets one line and exit status 1;
anything else that goes wrong is a bug and keeps its traceback.

SIGTERM (e.g. `kill PID`, a scheduler's preemption) ends the run cleanly: one line, no stack
dump, nothing saved beyond the last checkpoint, the local Ray cluster this run started shut down,
and exit status 143 (128 + SIGTERM, as a shell reports a process ended by the signal).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence

from roll.configs import ConfigError, load_config


def parse_config_args(argv: Sequence[str] | None, prog: str, description: str) -> argparse.Namespace:
    """`--config_path`, `--config_name` and hydra overrides, in any order (the CLIs' common part)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config_path", required=True, help="directory of the YAML")
    parser.add_argument("--config_name", required=True, help="YAML file name, without .yaml")
    parser.add_argument("overrides", nargs="*", help="hydra overrides, e.g. max_steps=10")
    return parser.parse_intermixed_args(argv)


def main(argv: Sequence[str] | None = None, examples_dir: str | None = None, rollout_only: bool = False) -> int:
    """Load the config and run the pipeline; returns the process exit status.

    `examples_dir` is a second place where a relative `--config_path` is looked up, so that
    `--config_path frozen_lake` works from the repository root as well as from `examples/`.
    A config without `actor_train` runs the rollout-only pipeline (`roll.pipeline.rollout_pipeline`);
    `rollout_only` (ROLL's start_agentic_rollout_pipeline.py) runs it whatever the config holds.
    """
    prog = "start_agentic_rollout_pipeline" if rollout_only else "start_agentic_pipeline"
    args = parse_config_args(argv, prog, "Train an LLM agent with RL on text environments.")
    try:
        config_dir = resolve_config_dir(args.config_path, examples_dir)
        config = load_config(config_dir, args.config_name, args.overrides, rollout_only=rollout_only)
        from roll.pipeline.preflight import run_preflight
        from roll.pipeline.prestart import check_before_start  # imports the envs: after the config loaded

        check_before_start(config)  # env types and env_config keys, LoRA targets, the device layout
        run_preflight(config)  # the output dir, the model's config.json, one env per tag
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    # Imported only now: torch and Ray take seconds, a config error should not wait for them.
    import ray
    from ray.exceptions import NodeDiedError, ObjectLostError, RayActorError, RayTaskError, WorkerCrashedError

    from roll.agentic.rollout.scheduler import RolloutFailed
    from roll.core.errors import EngineFailed
    from roll.distributed.placement import PlacementError
    from roll.pipeline.agentic_pipeline import AgenticPipeline
    from roll.pipeline.checkpoint import CheckpointDamaged
    from roll.pipeline.cluster import ClusterError, joined, lost_nodes
    from roll.pipeline.guards import TrainingDiverged
    from roll.pipeline.recorded_rollout import RecordingMissing
    from roll.pipeline.rollout_pipeline import AgenticRolloutPipeline

    ray_was_up = ray.is_initialized()  # a caller's Ray (a notebook, a test) is left running
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if in_main_thread else None
    try:
        (AgenticRolloutPipeline if config.rollout_only else AgenticPipeline)(config).run()
    except (Terminated, SystemError) as err:
        if not _terminated(err):  # a SystemError of its own: a bug, keep its traceback
            raise
        print(
            "training stopped: SIGTERM; resume from the last checkpoint with resume_from_checkpoint=true",
            file=sys.stderr,
        )
        return 128 + signal.SIGTERM
    except (PlacementError, CheckpointDamaged) as err:  # a device_mapping this machine cannot hold,
        # a resume_from_checkpoint path that is not an intact checkpoint: config errors here
        print(f"config error: {err}", file=sys.stderr)
        return 2
    except ClusterError as err:  # ray_address: no cluster there, or it refused the driver's token
        print(f"cluster error: {err}", file=sys.stderr)
        return 2
    except (TrainingDiverged, RolloutFailed, EngineFailed, RecordingMissing) as err:
        print(f"training stopped: {err}", file=sys.stderr)
        return 1
    except (RayActorError, NodeDiedError, ObjectLostError, WorkerCrashedError, KeyboardInterrupt, RayTaskError) as err:
        # a cluster node gone takes its workers; its death may be reported a little after theirs,
        # and a rank on a surviving node may fail first (gloo: "Connection closed by peer")
        lost = lost_nodes(wait_s=30.0 if joined() and not isinstance(err, KeyboardInterrupt) else 0.0)
        if isinstance(err, RayTaskError) and not lost:
            raise  # an error inside a worker with every node alive: a bug, keep its traceback
        if lost:
            print(
                f"training stopped: lost node {', '.join(lost)}; last checkpoint: {_last_checkpoint(config)}; "
                "resume with resume_from_checkpoint=true once the cluster has room again",
                file=sys.stderr,
            )
            return 1
        if isinstance(err, KeyboardInterrupt):
            raise
        # e.g. the inference or actor worker's process was killed
        print(
            f"training stopped: a worker process died ({type(err).__name__}); resume from the last "
            f"checkpoint with resume_from_checkpoint=true. {_first_line(err)}",
            file=sys.stderr,
        )
        return 1
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)
        if not ray_was_up:
            _shutdown_ray()
    return 0


class Terminated(Exception):
    """The process got SIGTERM (raised from the signal handler, in the main thread)."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


def _terminated(err: BaseException | None) -> bool:
    """Whether `err` is, or was caused by, `Terminated`: raised inside Ray's compiled wait/get
    loops it comes back as a SystemError whose cause is the Terminated."""
    seen = 0
    while err is not None and seen < 10:
        if isinstance(err, Terminated):
            return True
        err, seen = err.__cause__ or err.__context__, seen + 1
    return False


def _shutdown_ray() -> None:
    """Stop the Ray processes this run started (a local cluster), on every way out; SIGTERM is
    ignored meanwhile so a second one does not cut the shutdown short."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            ray.shutdown()
        finally:
            signal.signal(signal.SIGTERM, previous)


def _last_checkpoint(config) -> str:
    from roll.pipeline import checkpoint as ckpt

    path = ckpt.latest(config.output_dir)
    return str(path) if path is not None else "none"


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else ""


def resolve_config_dir(config_path: str, examples_dir: str | None) -> str:
    """`config_path` as given if it is a directory (absolute or relative to the current
    directory), else relative to `examples_dir`; raises `ConfigError` when neither exists."""
    candidates = [config_path]
    if examples_dir is not None and not os.path.isabs(config_path):
        candidates.append(os.path.join(examples_dir, config_path))
    for candidate in candidates:
        if os.path.isdir(candidate):
            return os.path.abspath(candidate)
    looked_in = ", ".join(os.path.abspath(candidate) for candidate in candidates)
    raise ConfigError("config_path", f"no directory {config_path!r} (looked in: {looked_in})")


if __name__ == "__main__":
    sys.exit(main())
