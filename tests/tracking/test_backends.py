"""The wandb, mlflow, swanlab and trackio backends against the real libraries, on this machine only
(wandb and swanlab offline, mlflow and trackio in SQLite files), each checked by reading back what
the run stored; that none leaves a process or thread of its own behind; and the config check that
routes `track_with` / `tracker_kwargs` to them (`roll.configs.tracking`)."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from roll.configs.base import InvalidField
from roll.configs.tracking import TrackerKwargs, check_tracker
from roll.tracking import Tracker
from roll.tracking.backends import flat_params, make_backend, masked

REPO = Path(__file__).parents[2]
ROLL_RUNS = REPO / "tests" / "configs" / "roll_dialect" / "runs"  # ROLL-dialect YAMLs
CONFIG = {
    "exp_name": "lake",
    "seed": 7,
    "actor_train": {"training_args": {"learning_rate": 1e-6}, "device_mapping": [0, 1]},
    "tracker_kwargs": {"api_key": "sk-secret", "project": "p"},
    "system_envs": {"WANDB_API_KEY": "sk-secret", "OMP_NUM_THREADS": "1"},
}
STEPS = {1: {"train/success": 0.25, "losses/entropy": 1.5}, 2: {"train/success": 0.75}, 4: {"val/success": 0.5}}


def extra(package: str) -> str:
    """The pyproject extra that installs a tracker's package: swanlab and trackio have their own."""
    return package if package in ("swanlab", "trackio") else "trackers"


def resolved(track_with, output_dir, system_envs=None, **kwargs):
    """`tracker_kwargs` as the config check leaves them for `make_backend`."""
    cfg = SimpleNamespace(
        track_with=track_with,
        tracker_kwargs=TrackerKwargs(**kwargs),
        output_dir=str(output_dir),
        system_envs=system_envs or {},
    )
    check_tracker(cfg)
    return cfg.tracker_kwargs.model_dump()


def run_tracker(tmp_path, track_with, **kwargs):
    out = tmp_path / "out"
    backend = make_backend(track_with, resolved(track_with, out, **kwargs), "lake")
    with Tracker(out, tmp_path / "tb", backend=backend) as tracker:
        tracker.log_config(CONFIG)
        for step, values in STEPS.items():
            tracker.log(step, values)
    return out, backend


def wandb_records(run_dir):
    """The records of a run's `.wandb` transaction log, as wandb's own reader prints them."""
    proc = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def test_wandb_offline_run_holds_each_step_and_the_masked_config(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is not installed (pip install 'roll[trackers]')")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # any network use would fail, not hang
    out, backend = run_tracker(tmp_path, "wandb", project="roll-test", tags=["cpu"], api_key="sk-secret")
    [run_dir] = (out / "wandb").glob("offline-run-*")
    assert run_dir == (out / "wandb" / "latest-run").resolve()
    records = wandb_records(run_dir)
    history = [r["history"] for r in records if r["type"] == "history"]
    assert [h["step"]["num"] for h in history] == [1, 2, 4]
    for h, values in zip(history, STEPS.values()):
        assert {k: v for k, v in h["item"].items() if not k.startswith("_")} == values
    [run] = [r["run"] for r in records if r["type"] == "run"]
    assert (run["display_name"], run["project"], run["tags"]) == ("lake", "roll-test", ["cpu"])
    assert run["telemetry"]["feature"]["offline"]
    config = {}
    for r in records:  # the run's config at init, then each update
        if r["type"] in ("run", "config"):
            config.update((r["run"]["config"] if r["type"] == "run" else r["config"])["update"])
    assert config["actor_train"] == CONFIG["actor_train"] and config["seed"] == 7
    assert config["tracker_kwargs"] == {"api_key": "***", "project": "p"}
    assert config["system_envs"] == {"WANDB_API_KEY": "***", "OMP_NUM_THREADS": "1"}
    assert "sk-secret" not in (run_dir / f"run-{run['run_id']}.wandb").read_bytes().decode(errors="replace")
    assert [r["exit"]["exit_code"] for r in records if r["type"] == "exit"] == [0]


def test_mlflow_sqlite_run_holds_metric_history_params_and_tags(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="mlflow is not installed (pip install 'roll[trackers]')")
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)  # mlflow's own defaults would write ./mlruns or ./mlflow.db here
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out, backend = run_tracker(tmp_path, "mlflow", tags={"team": "rl"})
    uri = f"sqlite:///{out / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("lake")
    assert experiment.artifact_location == (out / "mlflow-artifacts").as_uri()
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.run_id == backend.run.info.run_id and run.info.status == "FINISHED"
    history = {
        key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)] for key in run.data.metrics
    }
    assert history == {
        "train/success": [(1, 0.25), (2, 0.75)],
        "losses/entropy": [(1, 1.5)],
        "val/success": [(4, 0.5)],
    }
    assert run.data.params == {
        "exp_name": "lake",
        "seed": "7",
        "actor_train.training_args.learning_rate": "1e-06",
        "actor_train.device_mapping": "[0, 1]",
        "tracker_kwargs.api_key": "***",
        "tracker_kwargs.project": "p",
        "system_envs.WANDB_API_KEY": "***",
        "system_envs.OMP_NUM_THREADS": "1",
    }
    assert run.data.tags["team"] == "rl" and run.data.tags["mlflow.runName"] == "lake"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "tb"]  # nothing in the working dir


def test_a_config_model_reaches_the_backend_as_json_values(tmp_path):
    from pydantic import BaseModel

    class Config(BaseModel):
        output_dir: Path
        tracker_kwargs: TrackerKwargs

    class Recorder:
        def log_config(self, config):
            self.config = config

        def close(self):
            pass

    recorder = Recorder()
    with Tracker(tmp_path, tmp_path / "tb", backend=recorder) as tracker:
        tracker.log_config(Config(output_dir=tmp_path, tracker_kwargs=TrackerKwargs(log_dir="tb")))
    assert recorder.config["output_dir"] == str(tmp_path) and recorder.config["tracker_kwargs"]["log_dir"] == "tb"
    with Tracker(tmp_path, tmp_path / "tb") as tracker:
        tracker.log_config(object())  # no backend: nothing is dumped


def test_flat_params_are_dotted_text_cut_to_mlflows_limit():
    params = flat_params({"a": {"b": None, "c": [1, 2]}, "d": {}, "e": "x" * 7000, "f": True})
    assert params == {"a.b": "null", "a.c": "[1, 2]", "d": "{}", "e": "x" * 6000, "f": "true"}
    assert masked({"login": {"Token": "t", "user": "u"}, "password": None}) == {
        "login": {"Token": "***", "user": "u"},
        "password": None,
    }


@pytest.mark.parametrize(
    "track_with, kwargs, key, reason",
    [
        ("wandb", {"tracking_uri": "file:x"}, "tracker_kwargs.tracking_uri", "is not an argument of track_with wandb"),
        ("mlflow", {"project": "p"}, "tracker_kwargs.project", "is not an argument of track_with mlflow"),
        ("tensorboard", {"logdir": "x"}, "tracker_kwargs.logdir", "(it takes log_dir)"),
        ("stdout", {"log_dir": "x"}, "tracker_kwargs.log_dir", "(it takes no key)"),
        ("wandb", {"mode": "online"}, "tracker_kwargs.mode", "online needs a wandb API key"),
        ("wandb", {"mode": "local"}, "tracker_kwargs.mode", "tracker_kwargs.mode='local': expected offline, online"),
        ("swanlab", {"mode": "online"}, "tracker_kwargs.mode", "online needs a swanlab API key"),
        ("swanlab", {"notes": "n"}, "tracker_kwargs.notes", "is not an argument of track_with swanlab"),
        ("swanlab", {"log_dir": "a", "logdir": "b"}, "tracker_kwargs.logdir", "ROLL's spelling of log_dir"),
        ("trackio", {"tags": ["x"]}, "tracker_kwargs.tags", "is not an argument of track_with trackio"),
    ],
)
def test_a_key_the_backend_cannot_use_is_refused_by_name(tmp_path, monkeypatch, track_with, kwargs, key, reason):
    for package in ("wandb", "mlflow") + ((track_with,) if track_with in ("swanlab", "trackio") else ()):
        pytest.importorskip(package, reason=f"{package} is not installed (pip install 'roll[{extra(package)}]')")
    for name in ("WANDB_API_KEY", "SWANLAB_API_KEY", "SWANLAB_MODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("roll.configs.tracking._swanlab_saved_key", lambda: False)  # no `swanlab login` here
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    with pytest.raises(InvalidField) as info:
        resolved(track_with, tmp_path, **kwargs)
    assert info.value.key == key and reason in info.value.reason


@pytest.mark.parametrize("track_with", ["wandb", "mlflow", "swanlab", "trackio"])
def test_a_missing_tracker_package_is_named_with_the_extra_that_installs_it(tmp_path, monkeypatch, track_with):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == track_with else find_spec(name))
    with pytest.raises(InvalidField) as info:
        resolved(track_with, tmp_path)
    assert (info.value.key, info.value.reason) == (
        "track_with",
        f"{track_with!r} needs the {track_with} package (pip install 'roll[{extra(track_with)}]'); "
        "or use tensorboard or stdout",
    )


def test_wandb_defaults_to_offline_under_output_dir_and_goes_online_only_with_a_key(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is not installed (pip install 'roll[trackers]')")
    for name in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    assert resolved("wandb", tmp_path)["mode"] == "offline"
    assert resolved("wandb", tmp_path)["log_dir"] == str(tmp_path)
    assert resolved("wandb", tmp_path, {"WANDB_MODE": "disabled"})["mode"] == "disabled"
    with pytest.raises(InvalidField, match="online needs a wandb API key"):
        resolved("wandb", tmp_path, {"WANDB_MODE": "online"})
    assert resolved("wandb", tmp_path, {"WANDB_MODE": "online", "WANDB_API_KEY": "k"})["mode"] == "online"
    assert resolved("wandb", tmp_path, mode="online", api_key="k")["mode"] == "online"
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password k\n")
    (tmp_path / "netrc").chmod(0o600)
    assert resolved("wandb", tmp_path, mode="online")["mode"] == "online"


def test_mlflow_defaults_to_a_sqlite_file_under_output_dir(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="mlflow is not installed (pip install 'roll[trackers]')")
    monkeypatch.chdir(tmp_path)
    kwargs = resolved("mlflow", "out")
    assert kwargs["tracking_uri"] == f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}"
    assert kwargs["artifact_location"] == (tmp_path / "out" / "mlflow-artifacts").as_uri()
    assert resolved("mlflow", "out", tracking_uri="http://mlflow:5000")["artifact_location"] is None


FRESH_RUN = """
import json, sys, threading
from types import SimpleNamespace

import psutil

from roll.configs.tracking import TrackerKwargs, check_tracker
from roll.tracking import Tracker
from roll.tracking.backends import make_backend

track_with, out, kwargs, config, steps = json.loads(sys.stdin.read())  # not argv: trackers record it
cfg = SimpleNamespace(track_with=track_with, tracker_kwargs=TrackerKwargs(**kwargs), output_dir=out, system_envs={})
check_tracker(cfg)
threads = {t.ident for t in threading.enumerate()}
backend = make_backend(track_with, cfg.tracker_kwargs.model_dump(), "lake")
with Tracker(out, out + "/tb", backend=backend) as tracker:
    tracker.log_config(config)
    for step, values in steps.items():
        tracker.log(int(step), values)
    during = [p.cmdline() for p in psutil.Process().children(recursive=True)]
report = {
    "children_during": during,
    "children_after": [p.cmdline() for p in psutil.Process().children(recursive=True)],
    "threads_after": [repr(t) for t in threading.enumerate() if t.ident not in threads],
}
if track_with == "trackio":  # trackio reads its dir when imported: read back in the process that wrote
    from trackio.sqlite_storage import SQLiteStorage

    report["runs"] = SQLiteStorage.get_runs("lake")
    report["logs"] = SQLiteStorage.get_logs("lake", "lake")
    report["config"] = SQLiteStorage.get_run_config("lake", "lake")
print("REPORT " + json.dumps(report))
"""


def fresh_run(track_with, out, **kwargs):
    """The Tracker of `run_tracker` in a process of its own (a tracker library's threads and
    children, and trackio's import-time dir, are per process); its report after close."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for name in ("SWANLAB_MODE", "SWANLAB_API_KEY", "TRACKIO_DIR", "TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL"):
        env.pop(name, None)
    env["SWANLAB_API_HOST"] = env["SWANLAB_WEB_HOST"] = "http://127.0.0.1:9"  # network use would fail, not hang
    env["HF_HUB_OFFLINE"] = "1"
    args = json.dumps([track_with, str(out), kwargs, CONFIG, STEPS])
    proc = subprocess.run(
        [sys.executable, "-c", FRESH_RUN],
        input=args,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=out.parent,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    [line] = [line for line in proc.stdout.splitlines() if line.startswith("REPORT ")]
    report = json.loads(line.removeprefix("REPORT "))
    # nothing of theirs runs beside the run, so a kill leaves nothing; nothing is left after close
    assert report["children_during"] == [] and report["children_after"] == [] and report["threads_after"] == []
    return report


def swanlab_records(run_file):
    """The records of a `.swanlab` file, through swanlab's own reader (what `swanlab sync` replays)."""
    from google.protobuf.json_format import MessageToDict
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    reader = DataStoreReader()
    reader.open(run_file)
    records = []
    for data in reader:
        record = Record()
        record.ParseFromString(data)
        records.append(MessageToDict(record, always_print_fields_with_no_presence=True))  # 0 and 0.0 too
    reader.close()
    return records


def swanlab_scalars(records):
    """(step, key, value) of each logged metric, in order; swanlab's own system metrics
    (`__swanlab__.cpu.pct`, ...) left out."""
    scalars = [r["scalar"] for r in records if "scalar" in r]
    return [
        (int(r["step"]), r["key"], r["value"]["number"]) for r in scalars if not r["key"].startswith("__swanlab__.")
    ]


def test_swanlab_offline_run_holds_each_step_and_the_masked_config(tmp_path):
    pytest.importorskip("swanlab", reason="swanlab is not installed (pip install 'roll[swanlab]')")
    import yaml

    out = tmp_path / "out"
    fresh_run("swanlab", out, project="roll-test", tags=["cpu"], description="first try")
    [run_file] = (out / "swanlog").glob("run-*/run-*.swanlab")
    records = swanlab_records(run_file)
    scalars = swanlab_scalars(records)
    assert scalars == [(step, key, value) for step, values in STEPS.items() for key, value in values.items()]
    [start] = [r["start"] for r in records if "start" in r]
    assert (start["project"], start["name"], start["tags"], start["description"]) == (
        "roll-test",
        "lake",
        ["cpu"],
        "first try",
    )
    assert [r["finish"]["state"] for r in records if "finish" in r] == ["RUN_STATE_FINISHED"]
    assert not [r for r in records if "log" in r]  # the console stays on the terminal
    config = {k: v["value"] for k, v in yaml.safe_load((run_file.parent / "files" / "config.yaml").read_text()).items()}
    assert config["actor_train"] == CONFIG["actor_train"] and config["seed"] == 7
    assert config["tracker_kwargs"] == {"api_key": "***", "project": "p"}
    assert config["system_envs"] == {"WANDB_API_KEY": "***", "OMP_NUM_THREADS": "1"}
    assert not [f for f in run_file.parent.rglob("*") if f.is_file() and b"sk-secret" in f.read_bytes()]
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl", "swanlog", "tb"]


def test_trackio_run_is_a_local_sqlite_file_holding_each_step_and_the_masked_config(tmp_path):
    pytest.importorskip("trackio", reason="trackio is not installed (pip install 'roll[trackio]')")
    out = tmp_path / "out"
    report = fresh_run("trackio", out, group="g", auto_log_gpu=False)
    assert report["runs"] == ["lake"]
    logs = [{k: v for k, v in row.items() if k != "timestamp"} for row in report["logs"]]
    assert logs == [{"step": step, **values} for step, values in STEPS.items()]
    config = report["config"]
    assert config["actor_train"] == CONFIG["actor_train"] and config["seed"] == 7 and config["_Group"] == "g"
    assert config["tracker_kwargs"] == {"api_key": "***", "project": "p"}
    assert config["system_envs"] == {"WANDB_API_KEY": "***", "OMP_NUM_THREADS": "1"}
    assert sorted(p.name for p in (out / "trackio").iterdir() if p.suffix == ".db") == ["lake.db"]
    assert b"sk-secret" not in (out / "trackio" / "lake.db").read_bytes()
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl", "tb", "trackio"]


def test_swanlab_and_trackio_stay_local_unless_asked(tmp_path, monkeypatch):
    pytest.importorskip("swanlab", reason="swanlab is not installed (pip install 'roll[swanlab]')")
    pytest.importorskip("trackio", reason="trackio is not installed (pip install 'roll[trackio]')")
    for name in ("SWANLAB_MODE", "SWANLAB_API_KEY", "TRACKIO_SPACE_ID", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("roll.configs.tracking._swanlab_saved_key", lambda: False)
    monkeypatch.setattr("roll.configs.tracking._hf_token", lambda: False)
    swanlab = resolved("swanlab", tmp_path)
    assert (swanlab["mode"], swanlab["log_dir"]) == ("offline", str(tmp_path / "swanlog"))
    assert resolved("swanlab", tmp_path, logdir="sl")["log_dir"] == str(Path("sl").absolute())
    assert resolved("swanlab", tmp_path, {"SWANLAB_MODE": "local"})["mode"] == "local"
    assert resolved("swanlab", tmp_path, {"SWANLAB_MODE": "online", "SWANLAB_API_KEY": "k"})["mode"] == "online"
    with pytest.raises(InvalidField, match="SWANLAB_MODE='cloud': expected offline, local, online, disabled"):
        resolved("swanlab", tmp_path, {"SWANLAB_MODE": "cloud"})
    assert resolved("trackio", tmp_path)["log_dir"] == str(tmp_path / "trackio")
    for system_envs, kwargs in (({}, {"space_id": "me/runs"}), ({"TRACKIO_SPACE_ID": "me/runs"}, {})):
        with pytest.raises(InvalidField, match="a Hugging Face Space needs a token") as info:
            resolved("trackio", tmp_path, system_envs, **kwargs)
        assert info.value.key == "tracker_kwargs.space_id"
    assert resolved("trackio", tmp_path, {"HF_TOKEN": "t"}, space_id="me/runs")["space_id"] == "me/runs"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from roll.pipeline.tiny_model import main as build

    return build(["--preset", "frozen_lake", "--output_dir", str(tmp_path_factory.mktemp("m") / "tiny")])


def one_step_run(tiny_model, out, *overrides):
    """The TensorBoard one-step run of tests/configs/test_roll_dialect.py, with another tracker."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_BASE_URL": "http://127.0.0.1:9"}
    for name in ("WANDB_MODE", "WANDB_API_KEY", "MLFLOW_TRACKING_URI"):
        env.pop(name, None)
    proc = subprocess.run(
        [sys.executable, "examples/start_agentic_pipeline.py", "--config_path", str(ROLL_RUNS)]
        + ["--config_name", "traj_defaults", "+profile=cpu_smoke", f"pretrain={tiny_model}"]
        + [f"reward_pretrain={tiny_model}", "max_steps=1", "eval_steps=0"]
        + ["actor_train.strategy_args.strategy_name=torch_train", f"output_dir={out}", f"logging_dir={out}/logs"]
        + ["~tracker_kwargs.log_dir", f"checkpoint_config.output_dir={out}/ckpt", *overrides],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_wandb_online_without_a_key_exits_2_before_start(tiny_model, tmp_path):
    pytest.importorskip("wandb", reason="wandb is not installed (pip install 'roll[trackers]')")
    env = {**os.environ, "PYTHONPATH": str(REPO), "NETRC": str(tmp_path / "no-netrc"), "WANDB_MODE": "online"}
    env.pop("WANDB_API_KEY", None)
    proc = subprocess.run(
        [sys.executable, "examples/start_agentic_pipeline.py", "--config_path", str(ROLL_RUNS)]
        + ["--config_name", "traj_defaults", "+profile=cpu_smoke", f"pretrain={tiny_model}"]
        + [f"reward_pretrain={tiny_model}", f"output_dir={tmp_path}/out", "track_with=wandb"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    lines = [line for line in proc.stderr.splitlines() if line.startswith("config error")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert "tracker_kwargs.mode: online needs a wandb API key" in lines[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.lane  # a pipeline run each: .ci/run_lanes (the tracker-level tests above stay in .ci/run)
def test_a_pipeline_step_with_track_with_wandb_leaves_an_offline_run_of_its_metrics(tiny_model, tmp_path):
    pytest.importorskip("wandb", reason="wandb is not installed (pip install 'roll[trackers]')")
    metrics = one_step_run(tiny_model, tmp_path, "track_with=wandb", "+tracker_kwargs.project=roll-smoke")
    [run_dir] = (tmp_path / "wandb").glob("offline-run-*")
    records = wandb_records(run_dir)
    history = {r["history"]["step"]["num"]: r["history"]["item"] for r in records if r["type"] == "history"}
    assert sorted(history) == [line["step"] for line in metrics]
    for line in metrics:
        assert {k: v for k, v in history[line["step"]].items() if not k.startswith("_")} == pytest.approx(
            {k: v for k, v in line.items() if k != "step"}
        )
    [config] = [r["config"]["update"] for r in records if r["type"] == "config"]
    assert (config["max_steps"], config["track_with"], config["tracker_kwargs"]["mode"]) == (1, "wandb", "offline")


@pytest.mark.lane  # a pipeline run each: .ci/run_lanes (the tracker-level tests above stay in .ci/run)
def test_a_pipeline_step_with_track_with_mlflow_leaves_a_sqlite_run_of_its_metrics(tiny_model, tmp_path):
    pytest.importorskip("mlflow", reason="mlflow is not installed (pip install 'roll[trackers]')")
    from mlflow.tracking import MlflowClient

    metrics = one_step_run(tiny_model, tmp_path, "track_with=mlflow", "exp_name=lake-smoke")
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    [run] = client.search_runs([client.get_experiment_by_name("lake-smoke").experiment_id])
    logged = {k for line in metrics for k in line if k != "step"}
    assert set(run.data.metrics) == logged
    for key in ("train/success", "losses/policy_loss", "time/step_s"):
        history = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
        assert history == [(line["step"], pytest.approx(line[key])) for line in metrics if key in line]
    params = run.data.params
    assert (params["max_steps"], params["track_with"], params["exp_name"]) == ("1", "mlflow", "lake-smoke")
    assert run.info.status == "FINISHED" and run.data.tags["mlflow.runName"] == "lake-smoke"


@pytest.mark.lane  # a pipeline run each: .ci/run_lanes (the tracker-level tests above stay in .ci/run)
def test_a_pipeline_step_with_track_with_swanlab_leaves_an_offline_run_of_its_metrics(tiny_model, tmp_path):
    pytest.importorskip("swanlab", reason="swanlab is not installed (pip install 'roll[swanlab]')")
    metrics = one_step_run(tiny_model, tmp_path, "track_with=swanlab", "+tracker_kwargs.project=roll-smoke")
    [run_file] = (tmp_path / "swanlog").glob("run-*/run-*.swanlab")
    records = swanlab_records(run_file)
    logged = {(step, key): value for step, key, value in swanlab_scalars(records)}
    assert logged == pytest.approx({(line["step"], k): v for line in metrics for k, v in line.items() if k != "step"})
    assert [r["finish"]["state"] for r in records if "finish" in r] == ["RUN_STATE_FINISHED"]


@pytest.mark.lane  # a pipeline run each: .ci/run_lanes (the tracker-level tests above stay in .ci/run)
def test_a_pipeline_step_with_track_with_trackio_leaves_a_sqlite_run_of_its_metrics(tiny_model, tmp_path):
    pytest.importorskip("trackio", reason="trackio is not installed (pip install 'roll[trackio]')")
    metrics = one_step_run(tiny_model, tmp_path, "track_with=trackio", "exp_name=lake-smoke")
    read = "import json; from trackio.sqlite_storage import SQLiteStorage as S; "
    read += "print(json.dumps([S.get_logs('lake-smoke', 'lake-smoke'), S.get_run_config('lake-smoke', 'lake-smoke')]))"
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio")}
    proc = subprocess.run(
        [sys.executable, "-c", read], capture_output=True, text=True, timeout=120, env=env, check=True
    )
    logs, config = json.loads(proc.stdout.splitlines()[-1])
    assert [row["step"] for row in logs] == [line["step"] for line in metrics]
    for row, line in zip(logs, metrics):
        assert {k: v for k, v in row.items() if k != "timestamp"} == pytest.approx(line, nan_ok=True)
    assert (config["max_steps"], config["track_with"], config["exp_name"]) == (1, "trackio", "lake-smoke")
