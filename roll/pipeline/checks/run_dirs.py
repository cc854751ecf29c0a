"""The directories a run writes, checked before Ray starts (`roll.pipeline.checks.resources` calls it).

`run_dirs(cfg)` names every directory the run will write, by the key that sets it: `output_dir`
(metrics.jsonl, placement.json), `checkpoint_config.output_dir` (checkpoints; else `output_dir`),
`logging_dir` or `tracker_kwargs.log_dir` (TensorBoard events; with wandb, mlflow, swanlab or
trackio their files), `render_save_dir` (frames), `rollout_dump_dir` (trajectory dumps),
`trace_rollouts` (`output_dir/traces`) and `rollout_mock.dump_dir` when recording. For each, before anything starts:

- it can be created and written (a `ConfigError` naming the key, exit 2, otherwise);
- a fresh run (`resume_from_checkpoint: false`) finds none of the files this run would write
  there (`previous_outputs`): another run's outputs are refused by key unless
  `overwrite_output_dir: true`, which deletes exactly those files and says which, so that two
  runs sharing a checkpoint root (ROLL's `checkpoint_config.output_dir`) never clobber each other;
- the checkpoint directory has room for one checkpoint (`checkpoint_bytes`: the trained roles'
  weights plus AdamW's two moments, from the model files), when the run saves any.
"""

from __future__ import annotations

import json
import shutil
import struct
import sys
import tempfile
from pathlib import Path

from roll.configs import ConfigError
from roll.pipeline.failures.disk_full import size_text
from roll.pipeline.phases import checkpoint as ckpt
from roll.tracking.tracker import METRICS_FILE

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1}


def run_dirs(cfg) -> dict[str, str]:
    """Key -> directory, for every directory this run writes (one entry per distinct key)."""
    dirs = {"output_dir": cfg.output_dir}
    if cfg.checkpoint_config.output_dir:
        dirs["checkpoint_config.output_dir"] = cfg.checkpoint_config.output_dir
    if cfg.tensorboard_dir != cfg.logging_dir:
        dirs["tracker_kwargs.log_dir"] = cfg.tensorboard_dir
    else:
        dirs["logging_dir"] = cfg.logging_dir
    tracker_dir = cfg.tracker_kwargs.log_dir if cfg.track_with in ("wandb", "mlflow", "swanlab", "trackio") else None
    if tracker_dir and tracker_dir != cfg.output_dir:  # wandb's and swanlab's run dirs, mlflow's and trackio's store
        dirs["tracker_kwargs.log_dir"] = tracker_dir
    if cfg.render_save_dir:
        dirs["render_save_dir"] = cfg.render_save_dir
    if cfg.rollout_dump_dir:
        dirs["rollout_dump_dir"] = cfg.rollout_dump_dir
    if cfg.trace_rollouts:
        dirs["trace_rollouts"] = str(Path(cfg.output_dir) / "traces")
    if cfg.rollout_mock is not None and cfg.rollout_mock.records:
        dirs["rollout_mock.dump_dir"] = cfg.rollout_mock.dump_dir
    return dirs


def checkpoint_key(cfg) -> str:
    """The key that says where checkpoints go."""
    return "checkpoint_config.output_dir" if cfg.checkpoint_config.output_dir else "output_dir"


def previous_outputs(cfg) -> dict[str, list[Path]]:
    """Key -> the files and directories of another run that this run would write over or mix
    with (empty keys left out)."""
    dirs = run_dirs(cfg)
    found: dict[str, list[Path]] = {key: [] for key in dirs}
    metrics = Path(cfg.output_dir) / METRICS_FILE
    if metrics.is_file() and metrics.stat().st_size > 0:
        found["output_dir"].append(metrics)
    root = ckpt.checkpoint_root(cfg.checkpoint_dir)
    saves = not cfg.rollout_only  # a rollout-only run writes no checkpoint
    if saves and root.is_dir() and (any(root.glob("step_*")) or (root / ckpt.LATEST_FILE).exists()):
        found[checkpoint_key(cfg)].append(root)
    board_key = "tracker_kwargs.log_dir" if cfg.tensorboard_dir != cfg.logging_dir else "logging_dir"
    found[board_key] += sorted(Path(dirs[board_key]).glob("events.out.tfevents.*"))
    patterns = {
        "render_save_dir": "step_*",
        "rollout_dump_dir": "rollout_dump_data.*",
        "trace_rollouts": "*step_*.jsonl",
        "rollout_mock.dump_dir": "*/step_*.json",
    }
    for key, pattern in patterns.items():
        if key in dirs:
            found[key] += sorted(Path(dirs[key]).glob(pattern))
    return {key: paths for key, paths in found.items() if paths}


def check_run_dirs(cfg) -> None:
    """Every check of the module docstring, in order; the first failure as a `ConfigError`."""
    fresh = cfg.resume_from_checkpoint in (False, "", None)
    if fresh:
        refuse_or_clear(cfg)
    for key, directory in run_dirs(cfg).items():
        check_writable(directory, key)
    if cfg.save_steps > 0 and not cfg.rollout_only:
        check_room(cfg)


def refuse_or_clear(cfg) -> None:
    found = previous_outputs(cfg)
    if not found:
        return
    if not cfg.overwrite_output_dir:
        key, paths = next(iter(found.items()))
        directory = run_dirs(cfg)[key]
        names = list(dict.fromkeys(_shown(p, directory) for p in paths))
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        if len(names) in (2, 3):
            shown = ", ".join(names[:-1]) + " and " + names[-1]
        other = "output_dir" if key == "trace_rollouts" else key
        raise ConfigError(
            key,
            f"{directory} holds another run's {shown}; resume it with resume_from_checkpoint=true, "
            f"choose another {other}, or set overwrite_output_dir=true to delete them",
        )
    deleted = [path for paths in found.values() for path in paths]
    for path in deleted:
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    print(f"overwrite_output_dir: deleted {', '.join(str(p) for p in deleted)}", file=sys.stderr)


def _shown(path: Path, directory: str) -> str:
    """How a previous output is named in the error: `metrics.jsonl`, `checkpoints`, `traces/...`."""
    if path.name.startswith("events.out.tfevents."):
        return "TensorBoard events"
    if path.name == "checkpoints":
        inside = sorted(p.name for p in path.iterdir() if p.name.startswith("step_") or p.name == ckpt.LATEST_FILE)
        return f"checkpoints ({', '.join(inside[:3])}{', ...' if len(inside) > 3 else ''})"
    return path.relative_to(directory).as_posix() if path.is_relative_to(directory) else str(path)


def check_writable(directory: str, key: str) -> None:
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".roll-write-check-"):
            pass
    except OSError as err:
        raise ConfigError(key, f"cannot write to {directory}: {err.strerror or err}") from None


def check_room(cfg) -> None:
    need = checkpoint_bytes(cfg)
    directory = ckpt.checkpoint_root(cfg.checkpoint_dir).parent
    free = shutil.disk_usage(directory).free
    if free < need:
        raise ConfigError(
            checkpoint_key(cfg),
            f"{directory} has {size_text(free)} free and one checkpoint needs about {size_text(need)} "
            "(weights and optimizer state); free space or choose another directory",
        )


def checkpoint_bytes(cfg) -> int:
    """About what one checkpoint takes: each trained role's weights in its dtype, plus AdamW's
    two moments of its trained parameters (LoRA: the adapters only, taken as none here)."""
    total = 0
    for role in ("actor_train", "critic"):
        worker = cfg.built_roles.get(role)
        if worker is None:
            continue
        params = parameter_count(worker.model_args.model_name_or_path)
        copies = 1 if worker.model_args.lora is not None else 3
        total += params * DTYPE_BYTES[worker.model_args.dtype] * copies
    return total


def parameter_count(model_dir: str) -> int:
    """Parameters in a HF model dir: from the safetensors headers (exact), else the size of its
    weight files taken as float32."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if files:
        return sum(_safetensors_numel(f) for f in files)
    weights = [p for p in Path(model_dir).iterdir() if p.suffix in (".bin", ".pt", ".pth")]
    return sum(p.stat().st_size for p in weights) // 4


def _safetensors_numel(path: Path) -> int:
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    numel = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        start, end = entry["data_offsets"]
        numel += (end - start) // _SAFETENSORS_BYTES.get(entry["dtype"], 1)
    return numel
