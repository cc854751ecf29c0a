"""`track_with` (ROLL's key): where metrics go besides metrics.jsonl and TensorBoard.

"tensorboard" needs nothing more (the Tracker's own writer, under `tracker_kwargs.log_dir`);
"stdout" prints one line per logged step; "wandb" and "mlflow" use the real libraries, which the
config check requires to be installed (`roll.configs.dialect`).
"""

from __future__ import annotations

import json
import sys
from typing import Any


class StdoutBackend:
    def log(self, step: int, values: dict[str, float]) -> None:
        print(json.dumps({"step": step, **values}), file=sys.stdout, flush=True)

    def close(self) -> None:
        pass


class WandbBackend:
    def __init__(self, kwargs: dict[str, Any], exp_name: str):
        import wandb

        kwargs = {k: v for k, v in kwargs.items() if k != "log_dir" and v is not None}
        if "api_key" in kwargs:
            wandb.login(key=kwargs.pop("api_key"))
        kwargs.setdefault("name", exp_name)
        self.run = wandb.init(**kwargs)

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowBackend:
    def __init__(self, kwargs: dict[str, Any], exp_name: str):
        import mlflow

        self.mlflow = mlflow
        if kwargs.get("tracking_uri"):
            mlflow.set_tracking_uri(kwargs["tracking_uri"])
        mlflow.set_experiment(kwargs.get("experiment_name") or exp_name)
        mlflow.start_run(run_name=kwargs.get("run_name") or exp_name)

    def log(self, step: int, values: dict[str, float]) -> None:
        self.mlflow.log_metrics(dict(values), step=step)

    def close(self) -> None:
        self.mlflow.end_run()


def make_backend(track_with: str, kwargs: dict[str, Any], exp_name: str):
    """The sink of `track_with`; None for tensorboard (the Tracker writes TensorBoard itself)."""
    if track_with == "stdout":
        return StdoutBackend()
    if track_with == "wandb":
        return WandbBackend(kwargs, exp_name)
    if track_with == "mlflow":
        return MlflowBackend(kwargs, exp_name)
    return None
