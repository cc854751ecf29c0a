"""Command line entry: `--config_path DIR --config_name NAME [hydra overrides ...]`.

A bad config is the user's most common mistake, so it gets one line on stderr naming the key and
exit status 2 (no traceback). A run that cannot go on for a known reason (diverged training, a
rollout that keeps failing, a worker process that died for good) gets one line and exit status 1;
anything else that goes wrong is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from roll.configs import ConfigError, load_config


def main(argv: Sequence[str] | None = None, examples_dir: str | None = None) -> int:
    """Load the config and run the pipeline; returns the process exit status.

    `examples_dir` is a second place where a relative `--config_path` is looked up, so that
    `--config_path frozen_lake` works from the repository root as well as from `examples/`.
    """
    parser = argparse.ArgumentParser(
        prog="start_agentic_pipeline",
        description="Train an LLM agent with RL on text environments.",
    )
    parser.add_argument("--config_path", required=True, help="directory of the YAML")
    parser.add_argument("--config_name", required=True, help="YAML file name, without .yaml")
    parser.add_argument("overrides", nargs="*", help="hydra overrides, e.g. max_steps=10")
    args = parser.parse_intermixed_args(argv)
    try:
        config_dir = resolve_config_dir(args.config_path, examples_dir)
        config = load_config(config_dir, args.config_name, args.overrides)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    # Imported only now: torch and Ray take seconds, a config error should not wait for them.
    from ray.exceptions import NodeDiedError, ObjectLostError, RayActorError, WorkerCrashedError

    from roll.agentic.rollout.scheduler import RolloutFailed
    from roll.distributed.placement import PlacementError
    from roll.pipeline.agentic_pipeline import AgenticPipeline
    from roll.pipeline.cluster import ClusterError, joined, lost_nodes
    from roll.pipeline.guards import TrainingDiverged

    try:
        AgenticPipeline(config).run()
    except PlacementError as err:  # a device_mapping this machine cannot hold: a config error here
        print(f"config error: {err}", file=sys.stderr)
        return 2
    except ClusterError as err:  # ray_address: no cluster there, or it refused the driver's token
        print(f"cluster error: {err}", file=sys.stderr)
        return 2
    except (TrainingDiverged, RolloutFailed) as err:
        print(f"training stopped: {err}", file=sys.stderr)
        return 1
    except (RayActorError, NodeDiedError, ObjectLostError, WorkerCrashedError, KeyboardInterrupt) as err:
        # a cluster node gone takes its workers; its death may be reported a little after theirs
        lost = lost_nodes(wait_s=30.0 if joined() and not isinstance(err, KeyboardInterrupt) else 0.0)
        if lost:
            print(f"training stopped: lost node {', '.join(lost)}; last checkpoint: {_last_checkpoint(config)}; "
                  "resume with resume_from_checkpoint=true once the cluster has room again", file=sys.stderr)
            return 1
        if isinstance(err, KeyboardInterrupt):
            raise
        # e.g. the inference or actor worker's process was killed
        print(f"training stopped: a worker process died ({type(err).__name__}); resume from the last "
              f"checkpoint with resume_from_checkpoint=true. {_first_line(err)}", file=sys.stderr)
        return 1
    return 0


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
