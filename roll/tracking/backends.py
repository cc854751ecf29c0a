"""`track_with` (ROLL's key): where metrics go besides metrics.jsonl and TensorBoard.

"tensorboard" needs nothing more (the Tracker's own writer, under `tracker_kwargs.log_dir`);
"stdout" prints one line per logged step; "wandb", "mlflow", "swanlab" and "trackio" use the real
libraries (the `trackers` extra). The config check (`roll.configs.tracking`) has already refused
what cannot run here and filled the defaults: wandb offline under `output_dir`, mlflow in
`output_dir/mlflow.db`, swanlab offline in `output_dir/swanlog`, trackio in `output_dir/trackio`.
None of them starts a process or a server that outlives `close`: their workers are threads of
this process.
Every backend gets the same values at the same step as metrics.jsonl, and the run's config once
(`log_config`), with secrets masked.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SECRET = re.compile(r"api_key|token|secret|password", re.IGNORECASE)
"""Config keys whose values never reach a tracker (e.g. `tracker_kwargs.api_key`, a
`system_envs.WANDB_API_KEY`)."""
MLFLOW_PARAM_CHARS = 6000
"""mlflow's limit on a param's value; longer values (a long list) are cut to it."""


def masked(config: Mapping[str, Any]) -> dict[str, Any]:
    """`config` with the value of every key that names a secret replaced by "***", at any depth."""

    def mask(key: str, value: Any) -> Any:
        if SECRET.search(key) and value is not None:
            return "***"
        return masked(value) if isinstance(value, Mapping) else value

    return {key: mask(str(key), value) for key, value in config.items()}


def flat_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config -> mlflow params: dotted keys ("actor_train.model_args.dtype"), values as
    text (lists and None as JSON), cut to `MLFLOW_PARAM_CHARS`."""
    params: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            params.update(flat_params(value, name + "."))
        else:
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            params[name] = text[:MLFLOW_PARAM_CHARS]
    return params


class StdoutBackend:
    def log_config(self, config: Mapping[str, Any]) -> None:
        pass

    def log(self, step: int, values: dict[str, float]) -> None:
        print(json.dumps({"step": step, **values}), file=sys.stdout, flush=True)

    def close(self) -> None:
        pass


class WandbBackend:
    """One wandb run; offline (the default) writes `<log_dir>/wandb/offline-run-*/run-*.wandb`."""

    def __init__(self, kwargs: Mapping[str, Any], exp_name: str):
        import wandb

        args = {k: v for k, v in kwargs.items() if v is not None}
        settings = {"console": "off"}  # Ray's and tqdm's output stays on the terminal, not in the run
        if args.get("mode") == "online" and "api_key" in args:
            settings["api_key"] = args["api_key"]  # this run only; unlike wandb.login, nothing is saved
        args.pop("api_key", None)
        Path(args["log_dir"]).mkdir(parents=True, exist_ok=True)
        args["dir"] = args.pop("log_dir")
        args.setdefault("name", exp_name)
        self.run = wandb.init(**args, settings=wandb.Settings(**settings))

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.run.config.update(masked(config), allow_val_change=True)

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowBackend:
    """One mlflow run (the fluent API's active run, which `trace_to_mlflow` also logs to)."""

    def __init__(self, kwargs: Mapping[str, Any], exp_name: str):
        import mlflow

        self.mlflow = mlflow
        if kwargs.get("tracking_uri"):
            mlflow.set_tracking_uri(kwargs["tracking_uri"])
        name = kwargs.get("experiment_name") or exp_name
        experiment = mlflow.get_experiment_by_name(name)
        if experiment is None:
            mlflow.create_experiment(name, artifact_location=kwargs.get("artifact_location"))
        mlflow.set_experiment(name)
        tags = kwargs.get("tags") or {}
        if not isinstance(tags, Mapping):
            tags = dict.fromkeys(tags, "")
        self.run = mlflow.start_run(run_name=kwargs.get("run_name") or exp_name, tags=dict(tags))

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.mlflow.log_params(flat_params(masked(config)))

    def log(self, step: int, values: dict[str, float]) -> None:
        self.mlflow.log_metrics(dict(values), step=step)

    def close(self) -> None:
        self.mlflow.end_run()


class SwanlabBackend:
    """One swanlab run; offline (the default) writes `<log_dir>/run-<time>-<id>/run-<id>.swanlab`."""

    def __init__(self, kwargs: Mapping[str, Any], exp_name: str):
        import swanlab

        self.threads_before = set(threading.enumerate())
        settings: dict[str, Any] = {
            "terminal": {"proxy_type": "none"},  # the console stays on the terminal, not in the run
            "probe": {"requirements": False},  # no `pip list` subprocess at start
        }
        if kwargs.get("mode") == "online" and kwargs.get("api_key"):
            settings["api_key"] = kwargs["api_key"]  # this run only; unlike swanlab.login, nothing is saved
        self.run = swanlab.init(
            log_dir=kwargs["log_dir"],
            mode=kwargs["mode"],
            project=kwargs.get("project") or exp_name,
            workspace=kwargs.get("workspace"),
            name=kwargs.get("experiment_name") or exp_name,
            description=kwargs.get("description"),
            tags=kwargs.get("tags"),
            settings=swanlab.Settings(**settings),
        )

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.run.config.update(masked(config))

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()
        # swanlab 0.10.3 stops its file watcher's observer but not the inotify reader thread that
        # watchdog started for it (one idle thread and inotify fd per run): stop what is left.
        for thread in set(threading.enumerate()) - self.threads_before:
            if type(thread).__module__.startswith("watchdog.") and hasattr(thread, "stop"):
                thread.stop()
                thread.join(timeout=5)


class TrackioBackend:
    """One trackio run in `<log_dir>/<project>.db` (SQLite), or on a Space when `space_id` is set.

    trackio reads its dir (`TRACKIO_DIR`) once, when it is imported, so one process holds runs of
    one dir: a second dir is refused rather than written to the first."""

    def __init__(self, kwargs: Mapping[str, Any], exp_name: str):
        log_dir = Path(kwargs["log_dir"])
        loaded = sys.modules.get("trackio.utils")
        if loaded is not None and Path(loaded.TRACKIO_DIR) != log_dir:
            raise RuntimeError(
                f"tracker_kwargs.log_dir: trackio already writes to {loaded.TRACKIO_DIR} in this process"
            )
        os.environ["TRACKIO_DIR"] = str(log_dir)
        import trackio

        options = {
            k: kwargs[k] for k in ("group", "space_id", "auto_log_gpu", "gpu_log_interval") if kwargs.get(k) is not None
        }
        self.run = trackio.init(
            project=kwargs.get("project") or exp_name, name=kwargs.get("name") or exp_name, embed=False, **options
        )

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.run.config.update(masked(config))  # stored with the run's first logged step

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


def make_backend(track_with: str, kwargs: dict[str, Any], exp_name: str):
    """The sink of `track_with`; None for tensorboard (the Tracker writes TensorBoard itself)."""
    if track_with == "stdout":
        return StdoutBackend()
    if track_with == "wandb":
        return WandbBackend(kwargs, exp_name)
    if track_with == "mlflow":
        return MlflowBackend(kwargs, exp_name)
    if track_with == "swanlab":
        return SwanlabBackend(kwargs, exp_name)
    if track_with == "trackio":
        return TrackioBackend(kwargs, exp_name)
    return None
