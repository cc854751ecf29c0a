"""Every directory a run writes, and the checkpoint it resumes, checked before Ray starts
(roll/pipeline/checks/run_dirs.py, roll/pipeline/checks/resources.py), through the CLI as a user meets them.

A config that passes every check reaches the pipeline, whose import is blocked here: "started"."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from roll.cli import main
from roll.configs import ConfigError, load_config
from roll.pipeline.checks.run_dirs import check_room, checkpoint_bytes, parameter_count, run_dirs
from roll.pipeline.phases import checkpoint as ckpt
from tests.faults.timing import detected

CONFIG_DIR = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(autouse=True)
def no_pipeline(monkeypatch):
    monkeypatch.setitem(sys.modules, "roll.pipeline.agentic_pipeline", None)


def run(capsys, model_dir, *overrides):
    try:
        status = main(
            ["--config_path", CONFIG_DIR, "--config_name", "minimal_agentic", f"pretrain={model_dir}", *overrides]
        )
    except ImportError as err:
        assert "roll.pipeline.agentic_pipeline" in str(err)
        status = "started"
    return status, capsys.readouterr().err.splitlines()


def a_checkpoint(root: Path, step: int, model_dir: str) -> Path:
    """A complete checkpoint `root/checkpoints/step_N` (the model's config.json and a state), with
    its manifest, and `latest` naming it."""
    path = root / "checkpoints" / f"step_{step}"
    path.mkdir(parents=True)
    shutil.copy(Path(model_dir) / "config.json", path / "config.json")
    (path / "weights.bin").write_bytes(b"w" * 64)
    (path / ckpt.STATE_FILE).write_text(json.dumps({"step": step, "kl_ctl": {}}))
    (path / ckpt.MANIFEST_FILE).write_text(json.dumps(ckpt._manifest(path, fsync=False)))
    (root / "checkpoints" / ckpt.LATEST_FILE).write_text(path.name)
    return path


def digests(directory: Path) -> dict[str, str]:
    return {
        p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def test_a_shared_checkpoint_root_is_not_clobbered(tmp_path, model_dir, capsys):
    shared = tmp_path / "ckpt_root"  # ROLL's checkpoint_config.output_dir, another run's checkpoints in it
    a_checkpoint(shared, 1, model_dir)
    before = digests(shared)
    status, lines = run(
        capsys, model_dir, f"output_dir={tmp_path / 'run_b'}", f"+checkpoint_config.output_dir={shared}"
    )
    assert (status, lines) == (
        2,
        [
            f"config error: checkpoint_config.output_dir: {shared} holds another run's checkpoints (latest, step_1); "
            "resume it with resume_from_checkpoint=true, choose another checkpoint_config.output_dir, or set "
            "overwrite_output_dir=true to delete them"
        ],
    )
    assert digests(shared) == before


def test_overwrite_deletes_exactly_what_the_run_would_write_and_says_so(tmp_path, model_dir, capsys):
    out, logs, frames, dumps = (tmp_path / name for name in ("out", "logs", "frames", "dumps"))
    a_checkpoint(out, 2, model_dir)
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    (out / "traces").mkdir()
    (out / "traces" / "step_1.jsonl").write_text("{}\n")
    (out / "notes.txt").write_text("mine")  # not a run output: kept
    logs.mkdir()
    (logs / "events.out.tfevents.1.host.1.0").write_bytes(b"e")
    (logs / "other.txt").write_text("kept")
    (frames / "step_2").mkdir(parents=True)
    dumps.mkdir()
    (dumps / "rollout_dump_data.step_1.jsonl").write_text("{}\n")
    keys = [
        f"output_dir={out}",
        f"logging_dir={logs}",
        f"+render_save_dir={frames}",
        f"+rollout_dump_dir={dumps}",
        "+trace_rollouts=true",
    ]
    status, lines = run(capsys, model_dir, *keys)
    assert status == 2 and lines[0].startswith(
        f"config error: output_dir: {out} holds another run's metrics.jsonl and checkpoints (latest, step_2); "
    )
    status, lines = run(capsys, model_dir, *keys, "overwrite_output_dir=true")
    assert status == "started"
    deleted = [
        out / "metrics.jsonl",
        out / "checkpoints",
        logs / "events.out.tfevents.1.host.1.0",
        frames / "step_2",
        dumps / "rollout_dump_data.step_1.jsonl",
        out / "traces" / "step_1.jsonl",
    ]
    assert lines == [f"overwrite_output_dir: deleted {', '.join(map(str, deleted))}"]
    assert not any(p.exists() for p in deleted)
    assert (out / "notes.txt").read_text() == "mine" and (logs / "other.txt").read_text() == "kept"


@pytest.mark.parametrize(
    "key",
    [
        "+checkpoint_config.output_dir",
        "+tracker_kwargs.log_dir",
        "+render_save_dir",
        "+rollout_dump_dir",
        "+rollout_mock.dump_dir",
    ],
)
def test_every_directory_the_run_writes_must_be_writable(tmp_path, model_dir, capsys, key):
    (tmp_path / "a_file").write_text("")
    bad = tmp_path / "a_file" / "sub"
    extra = ["+rollout_mock.enable=true"] if key == "+rollout_mock.dump_dir" else []
    status, lines = run(capsys, model_dir, f"output_dir={tmp_path / 'run'}", f"{key}={bad}", *extra)
    assert (status, lines) == (2, [f"config error: {key.lstrip('+')}: cannot write to {bad}: Not a directory"])


def test_run_dirs_names_each_directory_by_its_key(tmp_path, model_dir):
    cfg = load_config(
        CONFIG_DIR,
        "minimal_agentic",
        [f"pretrain={model_dir}", "output_dir=o", "+tracker_kwargs.log_dir=tb", "+trace_rollouts=true"],
    )
    assert run_dirs(cfg) == {"output_dir": "o", "tracker_kwargs.log_dir": "tb", "trace_rollouts": "o/traces"}
    wandb = ["track_with=wandb", "+tracker_kwargs.log_dir=wb", "logging_dir=logs"]
    cfg = load_config(CONFIG_DIR, "minimal_agentic", [f"pretrain={model_dir}", "output_dir=o", *wandb])
    assert run_dirs(cfg) == {"output_dir": "o", "logging_dir": "logs", "tracker_kwargs.log_dir": "wb"}


@pytest.mark.parametrize("track_with, subdir", [("swanlab", "swanlog"), ("trackio", "trackio")])
def test_swanlab_and_trackio_files_are_checked_under_output_dir(tmp_path, model_dir, track_with, subdir):
    pytest.importorskip(track_with, reason=f"{track_with} is not installed (pip install 'roll[trackers]')")
    overrides = [f"pretrain={model_dir}", "output_dir=o", f"track_with={track_with}", "logging_dir=logs"]
    cfg = load_config(CONFIG_DIR, "minimal_agentic", overrides)
    assert run_dirs(cfg) == {
        "output_dir": "o",
        "logging_dir": "logs",
        "tracker_kwargs.log_dir": str(Path("o", subdir).absolute()),
    }


def test_one_checkpoint_is_estimated_from_the_model_files(tmp_path, model_dir):
    from transformers import AutoModelForCausalLM

    params = AutoModelForCausalLM.from_pretrained(model_dir).num_parameters()
    assert parameter_count(model_dir) == params
    cfg = load_config(CONFIG_DIR, "minimal_agentic", [f"pretrain={model_dir}", "save_steps=1"])
    assert checkpoint_bytes(cfg) == params * 4 * 3  # float32 weights, AdamW's two moments
    bf16 = load_config(
        CONFIG_DIR, "minimal_agentic", [f"pretrain={model_dir}", "+actor_train.model_args.dtype=bf16", "save_steps=1"]
    )
    assert checkpoint_bytes(bf16) == params * 2 * 3


def test_a_disk_without_room_for_one_checkpoint_is_refused(tmp_path, model_dir, monkeypatch):
    cfg = load_config(CONFIG_DIR, "minimal_agentic", [f"pretrain={model_dir}", f"output_dir={tmp_path}"])
    need = checkpoint_bytes(cfg)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10 * need, 10 * need, need - 1))
    with pytest.raises(ConfigError) as err:
        check_room(cfg)
    assert err.value.key == "output_dir" and "one checkpoint needs about" in err.value.message
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10 * need, 9 * need, need))
    check_room(cfg)


def test_a_damaged_resume_path_is_refused_before_start(tmp_path, model_dir, capsys):
    path = a_checkpoint(tmp_path / "old", 1, model_dir)
    (path / "weights.bin").write_bytes(b"w" * 10)  # cut short
    started = time.perf_counter()
    status, lines = run(capsys, model_dir, f"output_dir={tmp_path / 'run'}", f"resume_from_checkpoint={path}")
    detected("corrupt_checkpoint_on_resume", time.perf_counter() - started)  # recorded, not asserted
    assert (status, lines) == (
        2,
        [f"config error: resume_from_checkpoint: {path} is damaged (weights.bin: 10 bytes, the manifest says 64)"],
    )


def test_nothing_to_train_is_answered_before_start(tmp_path, model_dir, capsys):
    path = a_checkpoint(tmp_path / "run", 3, model_dir)
    status, lines = run(capsys, model_dir, f"output_dir={tmp_path / 'run'}", "resume_from_checkpoint=true")
    assert (status, lines) == (
        0,
        [f"nothing to train: {path} is at step 3 and max_steps is 3; raise max_steps to go on"],
    )
    assert run(capsys, model_dir, f"output_dir={tmp_path / 'run'}", "resume_from_checkpoint=true", "max_steps=4")[
        0
    ] == ("started")


def test_a_dangling_latest_is_named(tmp_path, model_dir, caplog):
    a_checkpoint(tmp_path, 1, model_dir)
    (tmp_path / "checkpoints" / ckpt.LATEST_FILE).write_text("step_7")
    with caplog.at_level(logging.WARNING, logger="roll"):
        assert ckpt.latest(str(tmp_path)) == tmp_path / "checkpoints" / "step_1"
    assert caplog.messages == [
        f"{tmp_path / 'checkpoints' / 'latest'} names step_7, which does not exist; looking for the newest "
        "intact checkpoint (step_1)"
    ]
