"""What the GPU end-to-end lane (benchmarks/gpu/gpu_e2e.py) records of one pipeline run: figures read
from the run's metrics.jsonl (the pipeline's own step timers, `time/*_s`, its memory and token
counts) and the arrival time of each line as the lane saw it, and the check that a checkpoint loads
with `from_pretrained` on CPU. Pure reading: no Ray, no GPU.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

PHASES = ("rollout", "batch", "score", "train", "sync", "offload", "reload", "validate")
"""`time/<phase>_s` keys; offload and reload are parts of the other phases' times."""
VAL_TARGET = 0.9


def read_metrics(output_dir: Path) -> list[dict]:
    path = Path(output_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a stopped run
            continue
    return rows


def summarize_run(output_dir: Path, run: dict, first_step: int = 1) -> dict:
    """The run's status and the figures of its steps >= first_step (the first of them is a warm-up,
    left out of the per-step figures when there are others)."""
    rows = read_metrics(output_dir)
    steps = [r for r in rows if r.get("step", 0) >= first_step and "time/step_s" in r]
    timed = steps[1:] if len(steps) > 1 else steps
    summary = {
        "status": run["status"],
        "rc": run["rc"],
        "wall_s": round(run["wall_s"], 3),
        "steps_done": max((r["step"] for r in steps), default=first_step - 1),
        "val_success": {str(r["step"]): r["val/success"] for r in rows if "val/success" in r},
        "step_s": _stats([r["time/step_s"] for r in timed]),
        "wall_step_s": _wall_step(run.get("arrivals", {}), first_step + 1),
        "split_s": {p: _mean([r[f"time/{p}_s"] for r in timed if f"time/{p}_s" in r]) for p in PHASES},
        "first_step_split_s": {p: steps[0].get(f"time/{p}_s") for p in PHASES} if steps else {},
        "peak_memory_gib": _peaks(steps),
        "generated_tokens_per_s": _tokens_per_s(timed),
        # Ray calls from env workers to the engine a step, and the generate requests they carried
        "engine_calls": _stats([r["rollout/engine_calls"] for r in timed if "rollout/engine_calls" in r]),
        "engine_requests": _stats([r["rollout/engine_requests"] for r in timed if "rollout/engine_requests" in r]),
        "weight_sync_path": _sync_path(steps),
        # each role's seconds waiting on the others a step (roll.pipeline.phases.idle_time), and their share
        "idle_s": {
            key[len("time/idle/") :]: _mean([r[key] for r in timed if key in r])
            for key in sorted({k for r in timed for k in r if k.startswith("time/idle/")})
        },
        "time_idle_fraction": _mean([r["time/idle_fraction"] for r in timed if "time/idle_fraction" in r]),
    }
    summary.update(time_to_val(rows, run.get("arrivals", {})))
    return summary


def time_to_val(rows: list[dict], arrivals: dict[int, float]) -> dict:
    """`time_to_val_0_9_s`: the pipeline's own seconds (steps and validations, from the step-0
    validation on; startup, logging and checkpoints not counted) until the first validation with
    success >= 0.9; `wall_to_val_0_9_s`: seconds from the run's launch until that step's line
    appeared (startup included). None when it was not reached."""
    spent = 0.0
    for row in sorted(rows, key=lambda r: r.get("step", 0)):
        spent += row.get("time/step_s", 0.0) + row.get("time/validate_s", 0.0)
        if row.get("val/success", 0.0) >= VAL_TARGET:
            wall = arrivals.get(row["step"])
            return {
                "time_to_val_0_9_s": round(spent, 3),
                "val_0_9_step": row["step"],
                "wall_to_val_0_9_s": None if wall is None else round(wall, 3),
            }
    return {"time_to_val_0_9_s": None, "val_0_9_step": None, "wall_to_val_0_9_s": None}


def resume_check(checkpoint: Path) -> dict:
    """`AutoModelForCausalLM.from_pretrained` of a checkpoint dir on CPU, and one forward pass."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(checkpoint)  # on CPU: no device_map (no accelerate needed)
        with torch.no_grad():
            logits = model(torch.tensor([[1, 2, 3]])).logits
    except Exception as err:  # recorded, not raised: the lane goes on to the resume
        return {"ok": False, "error": f"{type(err).__name__}: {err}"}
    return {
        "ok": bool(torch.isfinite(logits).all()),
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": str(next(model.parameters()).dtype),
    }


def _stats(values: list[float]) -> dict:
    if not values:
        return {}
    return {
        "mean": round(statistics.fmean(values), 4),
        "median": round(statistics.median(values), 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
        "n": len(values),
    }


def _wall_step(arrivals: dict[int, float], first: int) -> float | None:
    """The median gap between consecutive steps' lines as the lane saw them appear (polled every
    0.2 s): the step's wall time, logging, validation and checkpoints included where they fell."""
    gaps = [arrivals[s] - arrivals[s - 1] for s in sorted(arrivals) if s >= first and s - 1 in arrivals]
    return round(statistics.median(gaps), 3) if gaps else None


def _mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 4) if values else None


def _peaks(steps: list[dict]) -> dict[str, float]:
    """The largest `memory/<role>_peak_gib` of any step, by role."""
    peaks: dict[str, float] = {}
    for row in steps:
        for key, value in row.items():
            if key.startswith("memory/") and key.endswith("_peak_gib"):
                role = key[len("memory/") : -len("_peak_gib")]
                peaks[role] = round(max(peaks.get(role, 0.0), value), 3)
    return peaks


def _tokens_per_s(steps: list[dict]) -> float | None:
    """Tokens the engine generated over the rollout phases' seconds (env stepping included)."""
    tokens = sum(r.get("rollout/generated_tokens", 0.0) for r in steps)
    seconds = sum(r.get("time/rollout_s", 0.0) for r in steps)
    return round(tokens / seconds, 1) if tokens and seconds else None


def _sync_path(steps: list[dict]) -> str | None:
    """Which way the weights went: `sync/cuda_ipc` 1 "cuda_ipc" (handles on the shared GPU), 0 "cpu_copy"."""
    flags = {r["sync/cuda_ipc"] for r in steps if "sync/cuda_ipc" in r}
    if not flags:
        return None
    return "cuda_ipc" if flags == {1.0} else "cpu_copy" if flags == {0.0} else "mixed"
