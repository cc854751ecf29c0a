"""`track_with` and `tracker_kwargs` (ROLL's keys): which keys each backend takes, and the defaults
that keep every backend on this machine: wandb offline under `output_dir`, mlflow in a SQLite file
under `output_dir`, swanlab offline under `output_dir/swanlog`, trackio's SQLite files under
`output_dir/trackio`. docs/trackers.md has what each backend writes and how to view or sync it.

A wandb run goes online only when asked (`tracker_kwargs.mode: online` or `WANDB_MODE=online`)
and then only with an API key in reach (`tracker_kwargs.api_key`, `WANDB_API_KEY`, or a
`wandb login` entry in ~/.netrc); without one the config is refused before anything starts, so
a run never waits on a login prompt or a network it does not have. The same holds for swanlab
(`mode: online` or `SWANLAB_MODE=online` needs `tracker_kwargs.api_key`, `SWANLAB_API_KEY` or a
`swanlab login`) and for a trackio run that publishes to a Hugging Face Space (`space_id` or
`TRACKIO_SPACE_ID` needs `HF_TOKEN` or a `hf auth login`).
"""

from __future__ import annotations

import netrc
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, cast
from urllib.parse import urlparse

from roll.configs.base import ConfigModel, InvalidField

TRACKERS = ("tensorboard", "wandb", "mlflow", "swanlab", "trackio", "stdout")
"""The `track_with` values roll has a client for: all of ROLL's."""
LIBRARY_TRACKERS = ("wandb", "mlflow", "swanlab", "trackio")
"""The backends that need a package of the `trackers` extra."""
Mode = Literal["offline", "local", "online", "disabled"]
MODES = {"wandb": ("offline", "online", "disabled"), "swanlab": ("offline", "local", "online", "disabled")}
"""The `tracker_kwargs.mode` values of each backend that has modes."""

TRACKER_KEYS: dict[str, frozenset[str]] = {
    "tensorboard": frozenset({"log_dir"}),
    "stdout": frozenset(),
    "wandb": frozenset(
        {"log_dir", "project", "entity", "name", "notes", "group", "job_type", "tags", "mode", "api_key"}
    ),
    "mlflow": frozenset({"log_dir", "tracking_uri", "experiment_name", "run_name", "artifact_location", "tags"}),
    "swanlab": frozenset(
        {"log_dir", "logdir", "project", "workspace", "experiment_name", "description", "tags", "mode", "api_key"}
    ),
    "trackio": frozenset({"log_dir", "project", "name", "group", "space_id", "auto_log_gpu", "gpu_log_interval"}),
}
"""The `tracker_kwargs` keys each `track_with` backend takes; any other key set is refused."""

MLFLOW_DB = "mlflow.db"
MLFLOW_ARTIFACTS = "mlflow-artifacts"
SWANLAB_DIR = "swanlog"
"""swanlab's run dirs go to `<log_dir or output_dir>/swanlog/run-*` (swanlab's own default dir name)."""
TRACKIO_DIR = "trackio"
"""trackio's `<project>.db` files go to `<log_dir or output_dir>/trackio/` (its `TRACKIO_DIR`)."""


class TrackerKwargs(ConfigModel):
    """ROLL's `tracker_kwargs`: the `track_with` backend's arguments; a key it does not take is refused."""

    model_config = {**ConfigModel.model_config, "extra": "allow"}  # refused per backend, with the backend's keys
    log_dir: str | None = None
    """tensorboard: the dir of the event files (instead of `logging_dir`). wandb: the dir under which
    wandb writes `wandb/offline-run-*/` (default `output_dir`). mlflow: the dir of `mlflow.db` and
    `mlflow-artifacts/` when `tracking_uri` is not set (default `output_dir`). swanlab: the dir of
    its `run-*/` dirs (default `output_dir/swanlog`). trackio: the dir of its `<project>.db`
    (trackio's `TRACKIO_DIR`; default `output_dir/trackio`)."""
    logdir: str | None = None
    """swanlab: ROLL's spelling of `log_dir`."""
    project: str | None = None
    """wandb: the project (wandb's default: "uncategorized"). swanlab, trackio: the project; None:
    `exp_name`."""
    entity: str | None = None
    """wandb: the user or team the run belongs to when synced."""
    workspace: str | None = None
    """swanlab: the user or organisation the run belongs to when synced."""
    name: str | None = None
    """wandb, trackio: the run's name; None: `exp_name`."""
    notes: str | None = None
    """wandb: a description of the run."""
    description: str | None = None
    """swanlab: a description of the run."""
    group: str | None = None
    """wandb, trackio: a group of runs."""
    job_type: str | None = None
    """wandb: the run's job type."""
    tags: list[str] | dict[str, str] | None = None
    """wandb, swanlab: a list of tags. mlflow: tags as a mapping (a list becomes tags with empty
    values)."""
    mode: Mode | None = None
    """wandb: None: `WANDB_MODE` from the environment or `system_envs`, else "offline" (files only,
    no network, no login; `wandb sync` uploads them later). "online" needs an API key; "local" is
    swanlab's only. swanlab: None: `SWANLAB_MODE`, else "offline" (files only; `swanlab sync`
    uploads them later); "local" writes the same files for `swanlab watch`; "online" needs an API
    key."""
    api_key: str | None = None
    """wandb: the API key of an online run (else `WANDB_API_KEY` or ~/.netrc). swanlab: the same
    (else `SWANLAB_API_KEY` or `swanlab login`). Never logged."""
    tracking_uri: str | None = None
    """mlflow: where runs are stored; None: `sqlite:///<log_dir or output_dir>/mlflow.db`. A
    `http(s)://` server works too (mlflow's own timeouts apply)."""
    experiment_name: str | None = None
    """mlflow: the experiment; None: `exp_name`. swanlab: the run's name; None: `exp_name`."""
    run_name: str | None = None
    """mlflow: the run's name; None: `exp_name`."""
    artifact_location: str | None = None
    """mlflow: where a new experiment keeps its artifacts (rollout traces with `trace_to_mlflow`);
    None with the default store: `<log_dir or output_dir>/mlflow-artifacts`."""
    space_id: str | None = None
    """trackio: a Hugging Face Space to publish the run to (else `TRACKIO_SPACE_ID`); needs
    `HF_TOKEN` or `hf auth login`. None: local files only."""
    auto_log_gpu: bool | None = None
    """trackio: log GPU metrics beside the run's (None: when an NVIDIA GPU and nvidia-ml-py are found)."""
    gpu_log_interval: float | None = None
    """trackio: seconds between GPU metric logs (trackio's default: 10)."""


def check_tracker(cfg) -> None:
    """Refuse a missing package, a key the backend does not take and a run that would go online
    without a key; then fill the defaults (`cfg.tracker_kwargs`) that keep files under `output_dir`."""
    import importlib.util

    track_with, kwargs = cfg.track_with, cfg.tracker_kwargs
    if track_with in LIBRARY_TRACKERS and importlib.util.find_spec(track_with) is None:
        extra = track_with if track_with in ("swanlab", "trackio") else "trackers"  # pyproject.toml's extras
        raise InvalidField(
            "track_with",
            f"{track_with!r} needs the {track_with} package (pip install 'roll[{extra}]'); "
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
    env = {**os.environ, **cfg.system_envs}
    if track_with in MODES:
        _check_mode(track_with, kwargs, env)
    if track_with == "wandb":
        kwargs.log_dir = kwargs.log_dir or cfg.output_dir
    elif track_with == "mlflow":
        store = Path(kwargs.log_dir or cfg.output_dir).absolute()
        if kwargs.tracking_uri is None:
            kwargs.tracking_uri = f"sqlite:///{store / MLFLOW_DB}"
            kwargs.artifact_location = kwargs.artifact_location or (store / MLFLOW_ARTIFACTS).as_uri()
    elif track_with == "swanlab":
        if kwargs.logdir and kwargs.log_dir and Path(kwargs.logdir) != Path(kwargs.log_dir):
            raise InvalidField("tracker_kwargs.logdir", "is ROLL's spelling of log_dir; set one of them")
        log_dir = kwargs.log_dir or kwargs.logdir or Path(cfg.output_dir) / SWANLAB_DIR
        kwargs.log_dir, kwargs.logdir = str(Path(log_dir).absolute()), None
    elif track_with == "trackio":
        kwargs.log_dir = str(Path(kwargs.log_dir or Path(cfg.output_dir) / TRACKIO_DIR).absolute())
        if (kwargs.space_id or env.get("TRACKIO_SPACE_ID")) and not (env.get("HF_TOKEN") or _hf_token()):
            raise InvalidField(
                "tracker_kwargs.space_id",
                "a Hugging Face Space needs a token (HF_TOKEN or `hf auth login`); "
                "or leave space_id and TRACKIO_SPACE_ID unset: a local SQLite file under output_dir",
            )


def _check_mode(track_with: str, kwargs: TrackerKwargs, env: Mapping[str, str]) -> None:
    """wandb's and swanlab's mode: `tracker_kwargs.mode`, else `<LIB>_MODE`, else offline; online
    only with an API key in reach."""
    variable, modes = f"{track_with.upper()}_MODE", MODES[track_with]
    source = "tracker_kwargs.mode" if kwargs.mode else variable
    mode = kwargs.mode or env.get(variable) or "offline"
    if mode not in modes:
        raise InvalidField("tracker_kwargs.mode", f"{source}={mode!r}: expected {', '.join(modes)}")
    kwargs.mode = cast(Mode, mode)
    if mode != "online":
        return
    if track_with == "wandb" and not (kwargs.api_key or env.get("WANDB_API_KEY") or _netrc_has_key(env)):
        raise InvalidField(
            "tracker_kwargs.mode",
            "online needs a wandb API key (tracker_kwargs.api_key, WANDB_API_KEY or `wandb login`); "
            "or leave mode unset: offline files under output_dir, uploaded later with `wandb sync`",
        )
    if track_with == "swanlab" and not (kwargs.api_key or env.get("SWANLAB_API_KEY") or _swanlab_saved_key()):
        raise InvalidField(
            "tracker_kwargs.mode",
            "online needs a swanlab API key (tracker_kwargs.api_key, SWANLAB_API_KEY or `swanlab login`); "
            "or leave mode unset: offline files under output_dir, uploaded later with `swanlab sync`",
        )


def _swanlab_saved_key() -> bool:
    """Whether `swanlab login` saved a key (swanlab's settings read it from its own netrc file)."""
    import swanlab

    return bool(swanlab.Settings().api_key)


def _hf_token() -> bool:
    """Whether a Hugging Face token is saved (`hf auth login`); read from disk, no network."""
    from huggingface_hub import get_token

    return bool(get_token())


def _netrc_has_key(env: Mapping[str, str]) -> bool:
    """Whether ~/.netrc (or $NETRC) holds a password for the wandb host, as `wandb login` writes."""
    host = urlparse(env.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
    try:
        auth = netrc.netrc(env.get("NETRC")).authenticators(host or "")
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(auth and auth[2])
