"""ROLL's two ways of keeping a run's rollouts: `rollout_dump_dir` (readable JSON lines, for
people) and `rollout_mock` (the trajectories as JSON, for replaying a rollout exactly).

`recorded(scheduler, mock)` wraps a `RolloutScheduler` so that `collect` records what it returns
("dump") or returns a recording without playing the envs ("mock"); see
`roll.configs.rollout.RolloutMock` for the file layout.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

from roll.agentic.env.registry import resolve_env_class
from roll.core.errors import RunStopped
from roll.core.records import StepRecord, Trajectory
from roll.tracking.frames import save_episode_frames
from roll.tracking.traces import trace_record
from roll.utils.atomic import write_atomic

logger = logging.getLogger("roll")


def dump_trajectories(directory: str, step: int, trajs: list, tokenizer, prefix: str = "") -> Path:
    """`directory/rollout_dump_data.{prefix}step_{step}.jsonl` (ROLL's file name): one trace record
    per trajectory (`roll.tracking.traces.trace_record`), written whole then renamed."""
    path = Path(directory) / f"rollout_dump_data.{prefix}step_{step}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(
        path, "".join(json.dumps(trace_record(tr, tokenizer, step), ensure_ascii=False) + "\n" for tr in trajs)
    )
    return path


def write_trajectories(
    cfg, step: int, trajs: list, tokenizer, tracer, *, val: bool = False, frames: bool = False
) -> None:
    """A step's trajectories wherever the config asks for them: decoded traces (`tracer`, None when
    off), ROLL's `rollout_dump_dir` JSON lines, and with `frames` (they were collected with frames,
    for `render_save_dir`) each episode's text, PNG frames and GIF under `render_save_dir/step_N`
    (agents have no frames)."""
    if tracer is not None:
        tracer.write(step, trajs, prefix="val" if val else "train")
    if cfg.rollout_dump_dir:
        dump_trajectories(cfg.rollout_dump_dir, step, trajs, tokenizer, prefix="val_" if val else "")
    if frames:
        directory = Path(cfg.render_save_dir) / f"step_{step}"
        for tr in (t for t in trajs if cfg.custom_envs[t.tag].env_type != "agent"):
            save_episode_frames(directory, tr, resolve_env_class(cfg.custom_envs[tr.tag].env_type))


VAL_IMAGES_PER_TAG = 4
"""Frames of one validation episode per VL tag shown in TensorBoard (`log_validation_images`)."""


def log_validation_images(cfg, tracker, step: int, trajs: list[Trajectory]) -> None:
    """TensorBoard image panels `val/frames/<tag>`: the first `VAL_IMAGES_PER_TAG` frames of the
    first validation episode of each tag whose observations are images (the VL env manager), drawn
    as the env drew them (`frame_to_rgb`; the trajectories were collected with frames)."""
    from roll.configs.roll_compat.dialect import VL_ENV_MANAGERS

    shown: set[str] = set()
    for tr in trajs:
        env = cfg.custom_envs[tr.tag]
        if tr.tag in shown or env.env_manager_cls not in VL_ENV_MANAGERS or not tr.frames:
            continue
        shown.add(tr.tag)
        draw = resolve_env_class(env.env_type).frame_to_rgb
        tracker.log_images(step, f"val/frames/{tr.tag}", [draw(f) for f in tr.frames[:VAL_IMAGES_PER_TAG]])


def recording_path(dump_dir: str, mode: str, step: int) -> Path:
    """Where step `step` of a `mode` ("train" or "val") rollout is recorded (ROLL's layout)."""
    return Path(dump_dir) / mode / f"step_{step:06d}.json"


def encode_recording(trajs: list[Trajectory], dropped: list[str]) -> str:
    """Trajectories (and the causes of dropped ones) as JSON. Not a pickle: loading a recording
    must not run code (`tests/test_security.py`). Floats round-trip exactly (shortest repr)."""
    return json.dumps({"trajectories": [dataclasses.asdict(t) for t in trajs], "dropped": dropped})


def decode_recording(text: str) -> tuple[list[Trajectory], list[str]]:
    """The inverse of `encode_recording`: equal dataclasses (stop_reason as its string value)."""
    data = json.loads(text)
    trajs = [Trajectory(**{**t, "steps": [StepRecord(**s) for s in t["steps"]]}) for t in data["trajectories"]]
    return trajs, list(data["dropped"])


class RecordingMissing(RunStopped, RuntimeError):
    """`rollout_mock` mode "mock" reached a step that was never recorded."""


class RecordedRollout:
    """A rollout scheduler whose `collect` is recorded or replayed; everything else is the
    scheduler's."""

    def __init__(self, scheduler, dump_dir: str, replay: bool):
        self.scheduler, self.dump_dir, self.replay = scheduler, dump_dir, replay

    def collect(self, step: int, num_groups: int, keep_frames: bool = False, **kwargs) -> tuple[list, list[str]]:
        path = recording_path(self.dump_dir, self.scheduler.mode, step)
        if self.replay:
            if not path.is_file():
                raise RecordingMissing(
                    f"rollout_mock: no recording of {self.scheduler.mode} step {step} at {path}; "
                    "record it first with rollout_mock.mode=dump"
                )
            trajs, dropped = decode_recording(path.read_text(encoding="utf-8"))
            logger.info("rollout_mock: replayed %s step %d from %s", self.scheduler.mode, step, path)
            return trajs, dropped
        trajs, dropped = self.scheduler.collect(step, num_groups, keep_frames, **kwargs)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, encode_recording(trajs, dropped))
        return trajs, dropped

    def dispatch(self, step: int, num_groups: int, keep_frames: bool = False) -> None:
        """Groups ahead of time (async training); a replay plays nothing."""
        if not self.replay:
            self.scheduler.dispatch(step, num_groups, keep_frames)

    def restore(self, ledger: list[dict]) -> None:
        """A resumed run's owed groups (`RolloutScheduler.restore`); a replay plays nothing."""
        if not self.replay:
            self.scheduler.restore(ledger)

    def __getattr__(self, name: str):
        return getattr(self.scheduler, name)


def recorded(scheduler, mock):
    """`scheduler` itself without an enabled `rollout_mock`, else wrapped to record or replay."""
    if mock is None or not mock.enable:
        return scheduler
    return RecordedRollout(scheduler, mock.dump_dir, replay=mock.replays)
