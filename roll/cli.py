"""Command line entry: `--config_path DIR --config_name NAME [hydra overrides ...]`.

A bad config is the user's most common mistake, so it gets one line on stderr naming the key and
exit status 2 (no traceback). A run that cannot go on for a known reason (diverged training, a
rollout that keeps failing, a worker process that died for good) gets one line and exit status 1;
anything else that goes wrong is a bug and keeps its traceback. Each such error is a
`roll.core.errors.RollError` that carries its exit status and the line's prefix, so `main` has one
handler; errors from outside roll (Ray's, a full disk's) become RollErrors in `_as_roll_errors`.

SIGTERM (e.g. `kill PID`, a scheduler's preemption) and SIGINT (Ctrl-C) end the run cleanly: one
line, no stack dump, nothing saved beyond the last checkpoint, the local Ray cluster this run
started shut down, and exit status 128 + the signal (143, 130), as a shell reports a process ended
by it. A second Ctrl-C meanwhile stops the driver at once (exit status 130); the processes it
started are then ended by `roll.pipeline.failures.reaper`. A second SIGTERM is ignored.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType

from roll.configs import load_config
from roll.configs.command_line import parse_config_args, resolve_config_dir
from roll.core.errors import RollError, RunStopped


def main(argv: Sequence[str] | None = None, examples_dir: str | None = None, rollout_only: bool = False) -> int:
    """Load the config and run the pipeline; returns the process exit status.

    `examples_dir` is a second place where a relative `--config_path` is looked up, so that
    `--config_path frozen_lake` works from the repository root as well as from `examples/`.
    A config without `actor_train` runs the rollout-only pipeline (`roll.pipeline.rollout_pipeline`);
    `rollout_only` (ROLL's start_agentic_rollout_pipeline.py) runs it whatever the config holds.
    Every error the user can act on is a `RollError`: it says its one line and its exit status.
    """
    prog = "start_agentic_rollout_pipeline" if rollout_only else "start_agentic_pipeline"
    args = parse_config_args(argv, prog, "Train an LLM agent with RL on text environments.")
    driver: _Driver | None = None
    try:
        config = _checked_config(args, examples_dir, rollout_only)
        pipeline_class = _pipeline_class(config)  # torch and Ray imported only now: a config error does not wait
        driver = _Driver.start()
        with _as_roll_errors(config):
            pipeline_class(config).run()
        return 0
    except RollError as err:
        _say(err.line())
        return err.exit_code
    finally:
        if driver is not None:
            driver.stop()


def _checked_config(args: argparse.Namespace, examples_dir: str | None, rollout_only: bool):
    """The validated config, checked before Ray starts (`ConfigError`, or `NothingToTrain`)."""
    config_dir = resolve_config_dir(args.config_path, examples_dir)
    config = load_config(config_dir, args.config_name, args.overrides, rollout_only=rollout_only)
    from roll.pipeline.checks.config import check_before_start  # imports the envs: after the config loaded
    from roll.pipeline.checks.resources import check_resources

    check_before_start(config)  # env types and env_config keys, LoRA targets, the device layout
    check_resources(config)  # the run's directories, the resumed checkpoint, the models, one env per tag
    return config


def _pipeline_class(config) -> type:
    """The rollout-only pipeline for a config without `actor_train` (or `rollout_only`), else training."""
    if config.rollout_only:
        from roll.pipeline.rollout_pipeline import AgenticRolloutPipeline

        return AgenticRolloutPipeline
    from roll.pipeline.agentic_pipeline import AgenticPipeline

    return AgenticPipeline


class _Driver:
    """What the CLI sets up around a run and takes down on every way out: a local Ray cluster it
    starts (a caller's Ray, a notebook's or a test's, is left running) and the signal handlers."""

    def __init__(self, ray_was_up: bool, previous: dict):
        self.ray_was_up = ray_was_up
        self.previous = previous

    @classmethod
    def start(cls) -> _Driver:
        import ray

        from roll.pipeline.failures.worker_death import remember_oom_count

        ray_was_up = ray.is_initialized()
        remember_oom_count()  # a worker that dies later is told apart as OOM-killed by this count
        in_main_thread = threading.current_thread() is threading.main_thread()
        previous = {sig: signal.signal(sig, _raise_terminated) for sig in STOP_SIGNALS} if in_main_thread else {}
        return cls(ray_was_up, previous)

    def stop(self) -> None:
        if not self.ray_was_up:
            _shutdown_ray()
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


@contextmanager
def _as_roll_errors(config) -> Iterator[None]:
    """Errors from outside roll that the user can act on, as `RollError`s: a stop signal that Ray's
    compiled loops return as a SystemError, a full disk under the driver's own writes, a dead
    worker or a lost cluster node. Anything else goes on unchanged (a bug keeps its traceback)."""
    from ray.exceptions import NodeDiedError, ObjectLostError, RayActorError, RayTaskError, WorkerCrashedError

    from roll.pipeline.failures.disk_full import disk_full_line, is_disk_full
    from roll.pipeline.failures.worker_death import death_line, ray_logs_dir
    from roll.pipeline.setup.cluster import joined, lost_nodes

    try:
        yield
    except RollError:  # ours already (a worker's, carried by a Ray task error, too)
        raise
    except SystemError as err:
        signum = _terminated(err)
        if signum is None:  # a SystemError of its own: a bug, keep its traceback
            raise
        raise Terminated(signum) from err
    except OSError as err:  # the driver's own writes: a metrics line, a trace, a dump
        if not is_disk_full(err):
            raise
        where = os.path.dirname(err.filename) if isinstance(err.filename, str) else config.output_dir
        raise RunStopped(disk_full_line(where, None, _last_checkpoint_path(config))) from err
    except (RayActorError, NodeDiedError, ObjectLostError, WorkerCrashedError, KeyboardInterrupt, RayTaskError) as err:
        # a cluster node gone takes its workers; its death may be reported a little after theirs,
        # and a rank on a surviving node may fail first (gloo: "Connection closed by peer")
        lost = lost_nodes(wait_s=30.0 if joined() and not isinstance(err, KeyboardInterrupt) else 0.0)
        if isinstance(err, RayTaskError) and not lost:
            raise  # an error inside a worker with every node alive: a bug, keep its traceback
        if lost:
            raise RunStopped(
                f"lost node {', '.join(lost)}; last checkpoint: {_last_checkpoint(config)}; "
                "resume with resume_from_checkpoint=true once the cluster has room again"
            ) from err
        if isinstance(err, KeyboardInterrupt):
            raise
        # e.g. the inference or actor worker's process was killed, or could not start: say which and why
        raise RunStopped(death_line(err, _last_checkpoint(config), ray_logs_dir())) from err


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""The signals that end a run cleanly (a scheduler's preemption, Ctrl-C)."""


class Terminated(RunStopped):
    """The process got one of `STOP_SIGNALS` (raised from the signal handler, in the main thread);
    the run ends with exit status 128 + the signal, as a shell reports a process ended by it."""

    def __init__(self, signum: int):
        super().__init__(
            f"{signal.Signals(signum).name}; resume from the last checkpoint with resume_from_checkpoint=true"
        )
        self.signum = signum
        self.exit_code = 128 + signum


def _say(line: str) -> None:
    """One line on stderr, on a line of its own: a progress bar left open (the run stopped in the
    middle of a step) is closed first, which ends its line."""
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ())):
        bar.close()
    print(line, file=sys.stderr)


def _raise_terminated(signum, frame) -> None:
    signal.signal(signal.SIGINT, _exit_now)  # the clean stop is under way: a second Ctrl-C stops at once
    raise Terminated(signum)


def _exit_now(signum: int, frame: FrameType | None) -> None:
    os.write(2, f"stopped at once: {signal.Signals(signum).name} again\n".encode())
    os._exit(128 + signum)


def _terminated(err: BaseException | None) -> int | None:
    """The signal number when `err` is, or was caused by, `Terminated` (raised inside Ray's
    compiled wait/get loops it comes back as a SystemError whose cause is the Terminated)."""
    seen = 0
    while err is not None and seen < 10:
        if isinstance(err, Terminated):
            return err.signum
        err, seen = err.__cause__ or err.__context__, seen + 1
    return None


def _shutdown_ray() -> None:
    """Stop the Ray processes this run started (a local cluster), on every way out. Meanwhile
    SIGTERM is ignored, so that a second one (a scheduler's, a process group's) does not cut the
    shutdown short, and a Ctrl-C stops the driver at once (`_exit_now`): the user asked twice."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        in_main_thread = threading.current_thread() is threading.main_thread()
        handlers: dict[signal.Signals, Callable[[int, FrameType | None], None] | signal.Handlers] = {
            signal.SIGTERM: signal.SIG_IGN,
            signal.SIGINT: _exit_now,
        }
        previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()} if in_main_thread else {}
        try:
            ray.shutdown()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _last_checkpoint(config) -> str:
    path = _last_checkpoint_path(config)
    return str(path) if path is not None else "none"


def _last_checkpoint_path(config):
    from roll.pipeline.phases import checkpoint as ckpt

    return ckpt.latest(config.checkpoint_dir)


if __name__ == "__main__":
    sys.exit(main())
