"""`track_with` and `tracker_kwargs` (ROLL's keys): which keys each backend takes, and the defaults
that keep every backend on this machine: wandb offline under `output_dir`, mlflow in a SQLite file
under `output_dir`. docs/trackers.md has what each backend writes and how to view or sync it.

A wandb run goes online only when asked (`tracker_kwargs.mode: online` or `WANDB_MODE=online`)
and then only with an API key in reach (`tracker_kwargs.api_key`, `WANDB_API_KEY`, or a
`wandb login` entry in ~/.netrc); without one the config is refused before anything starts, so
a run never waits on a login prompt or a network it does not have.
"""

from __future__ import annotations

import netrc
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

from roll.configs.base import ConfigModel, InvalidField

TRACKERS = ("tensorboard", "wandb", "mlflow", "stdout")
"""The `track_with` values roll has a client for."""
REFUSED_TRACKERS = ("swanlab", "trackio")
"""ROLL's other `track_with` values: refused by name (docs/trackers.md says why)."""

TRACKER_KEYS: dict[str, frozenset[str]] = {
    "tensorboard": frozenset({"log_dir"}),
    "stdout": frozenset(),
    "wandb": frozenset(
        {"log_dir", "project", "entity", "name", "notes", "group", "job_type", "tags", "mode", "api_key"}
    ),
    "mlflow": frozenset({"log_dir", "tracking_uri", "experiment_name", "run_name", "artifact_location", "tags"}),
}
"""The `tracker_kwargs` keys each `track_with` backend takes; any other key set is refused."""

MLFLOW_DB = "mlflow.db"
MLFLOW_ARTIFACTS = "mlflow-artifacts"


class TrackerKwargs(ConfigModel):
    """ROLL's `tracker_kwargs`: the `track_with` backend's arguments; a key it does not take is refused."""

    model_config = {**ConfigModel.model_config, "extra": "allow"}  # refused per backend, with the backend's keys
    log_dir: str | None = None
    """tensorboard: the dir of the event files (instead of `logging_dir`). wandb: the dir under which
    wandb writes `wandb/offline-run-*/` (default `output_dir`). mlflow: the dir of `mlflow.db` and
    `mlflow-artifacts/` when `tracking_uri` is not set (default `output_dir`)."""
    project: str | None = None
    """wandb: the project (wandb's default: "uncategorized")."""
    entity: str | None = None
    """wandb: the user or team the run belongs to when synced."""
    name: str | None = None
    """wandb: the run's name; None: `exp_name`."""
    notes: str | None = None
    """wandb: a description of the run."""
    group: str | None = None
    """wandb: a group of runs."""
    job_type: str | None = None
    """wandb: the run's job type."""
    tags: list[str] | dict[str, str] | None = None
    """wandb: a list of tags. mlflow: tags as a mapping (a list becomes tags with empty values)."""
    mode: Literal["offline", "online", "disabled"] | None = None
    """wandb: None: `WANDB_MODE` from the environment or `system_envs`, else "offline" (files only,
    no network, no login; `wandb sync` uploads them later). "online" needs an API key."""
    api_key: str | None = None
    """wandb: the API key of an online run (else `WANDB_API_KEY` or ~/.netrc). Never logged."""
    tracking_uri: str | None = None
    """mlflow: where runs are stored; None: `sqlite:///<log_dir or output_dir>/mlflow.db`. A
    `http(s)://` server works too (mlflow's own timeouts apply)."""
    experiment_name: str | None = None
    """mlflow: the experiment; None: `exp_name`."""
    run_name: str | None = None
    """mlflow: the run's name; None: `exp_name`."""
    artifact_location: str | None = None
    """mlflow: where a new experiment keeps its artifacts (rollout traces with `trace_to_mlflow`);
    None with the default store: `<log_dir or output_dir>/mlflow-artifacts`."""


def check_tracker(cfg) -> None:
    """Refuse a backend roll has no client for, a missing package, a key the backend does not take
    and an online wandb run without a key; then fill the defaults (`cfg.tracker_kwargs`) that
    keep files under `output_dir`."""
    import importlib.util

    track_with, kwargs = cfg.track_with, cfg.tracker_kwargs
    if track_with in REFUSED_TRACKERS:
        raise InvalidField(
            "track_with",
            f"{track_with!r}: roll has no {track_with} client; use {', '.join(TRACKERS)} (docs/trackers.md)",
        )
    if track_with in ("wandb", "mlflow") and importlib.util.find_spec(track_with) is None:
        raise InvalidField(
            "track_with",
            f"{track_with!r} needs the {track_with} package (pip install 'roll[trackers]'); "
            "or use tensorboard or stdout",
        )
    given = sorted(set(kwargs.model_fields_set) | set(kwargs.model_extra or {}))
    known = TRACKER_KEYS[track_with]
    for key in given:
        if key not in known and getattr(kwargs, key, None) is not None:
            takes = ", ".join(sorted(known)) or "no key"
            raise InvalidField(
                f"tracker_kwargs.{key}", f"is not an argument of track_with {track_with} (it takes {takes})"
            )
    if track_with == "wandb":
        env = {**os.environ, **cfg.system_envs}
        kwargs.mode = kwargs.mode or env.get("WANDB_MODE") or "offline"
        if kwargs.mode not in ("offline", "online", "disabled"):
            raise InvalidField(
                "tracker_kwargs.mode", f"WANDB_MODE={kwargs.mode!r}: expected offline, online or disabled"
            )
        if kwargs.mode == "online" and not (kwargs.api_key or env.get("WANDB_API_KEY") or _netrc_has_key(env)):
            raise InvalidField(
                "tracker_kwargs.mode",
                "online needs a wandb API key (tracker_kwargs.api_key, WANDB_API_KEY or `wandb login`); "
                "or leave mode unset: offline files under output_dir, uploaded later with `wandb sync`",
            )
        kwargs.log_dir = kwargs.log_dir or cfg.output_dir
    elif track_with == "mlflow":
        store = Path(kwargs.log_dir or cfg.output_dir).absolute()
        if kwargs.tracking_uri is None:
            kwargs.tracking_uri = f"sqlite:///{store / MLFLOW_DB}"
            kwargs.artifact_location = kwargs.artifact_location or (store / MLFLOW_ARTIFACTS).as_uri()


def _netrc_has_key(env: Mapping[str, str]) -> bool:
    """Whether ~/.netrc (or $NETRC) holds a password for the wandb host, as `wandb login` writes."""
    host = urlparse(env.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
    try:
        auth = netrc.netrc(env.get("NETRC")).authenticators(host or "")
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(auth and auth[2])
