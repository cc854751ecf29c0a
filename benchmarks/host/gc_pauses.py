"""Python's garbage-collector pauses in a run, with and without freezing what startup made
(`roll.utils.heap`, on by default; `ROLL_GC_FREEZE=0` turns it off).

Two measurements, side by side in one invocation:
- collect: a fresh process imports what an env worker imports (torch, transformers, Ray, roll's
  rollout code) and loads the tokenizer; a full collection (`gc.collect()`) is timed `--repeats`
  times, then again after `heap.freeze_heap()`.
- pipeline: the README's FrozenLake example with a reference role and 512-row micro-batches (the
  GPU lane's part a) on CPU, with a model too small to cost anything (hidden 16, one layer), so
  that a step is only what it costs besides the model, as on a GPU. The training roles get one
  torch thread each (as `GPU_HOST_THREADS` keeps GPU roles from crowding the cores). `--rounds`
  runs with the freeze off and on, alternating; each runs `--steps` steps. Steps 1-2 (warm-up) are
  left out. A pause shows as a step far above the median: "slow" counts steps over 1.5 x median.

    python benchmarks/host/gc_pauses.py [--steps 40 --rounds 1 --repeats 5]

The last line is `RESULT gc_pauses collect_ms_off=<ms> collect_ms_on=<ms> step_mean_ratio=<off/on>
rollout_mean_ratio=<off/on> step_max_ratio=<off/on>`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: import from this checkout
from benchmarks.common import REPO, load_span

MICRO = ["--hidden_size", "16", "--num_hidden_layers", "1", "--num_attention_heads", "2", "--intermediate_size", "32"]
PART_A = [
    "use_kl_loss=true",
    "kl_loss_coef=0.001",
    "+reference.strategy_args.strategy_name=hf_infer",
    "actor_train.training_args.per_device_train_batch_size=512",
    "actor_train.training_args.gradient_accumulation_steps=1",
    "actor_train.infer_batch_size=512",
    "+reference.infer_batch_size=512",
    "+actor_train.strategy_args.strategy_config.num_threads=1",
    "+reference.strategy_args.strategy_config.num_threads=1",
    "save_steps=0",
    "eval_steps=1000",
]
COLLECT = """
import gc, json, statistics, sys, time
import torch, transformers, ray
from roll.agentic.rollout.env_worker import EnvWorker
from roll.models.loading import load_tokenizer
from roll.utils import heap
load_tokenizer(sys.argv[1])
def timed():
    out = []
    for _ in range(int(sys.argv[2])):
        start = time.perf_counter(); gc.collect(); out.append(time.perf_counter() - start)
    return 1000 * statistics.median(out)
objects = len(gc.get_objects())
off = timed()
heap.freeze_heap()
print(json.dumps({"objects": objects, "off_ms": off, "on_ms": timed(), "left": len(gc.get_objects())}))
"""


def collect_times(model: str, repeats: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", COLLECT, model, str(repeats)], capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_pipeline(
    model: str, out: Path, steps: int, switches: dict[str, str], overrides: list[str] = PART_A
) -> dict[str, list[float]]:
    """The README example with `overrides`, `switches` in its environment; each phase's seconds
    of steps 3 and on."""
    cmd = [sys.executable, "examples/start_agentic_pipeline.py", "--config_path", "frozen_lake"]
    cmd += ["--config_name", "agent_val_frozen_lake", f"pretrain={model}", f"output_dir={out}", f"max_steps={steps}"]
    proc = subprocess.run(cmd + overrides, cwd=REPO, env=dict(os.environ, **switches), capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["step"] > 2]
    return {key: [r[f"time/{key}_s"] for r in rows] for key in ("step", "rollout", "score", "train")}


def summary(times: dict[str, list[float]]) -> dict[str, float]:
    step = times["step"]
    median = statistics.median(step)
    return {
        "step_mean": statistics.mean(step),
        "step_median": median,
        "step_max": max(step),
        "slow_steps": sum(s > 1.5 * median for s in step) / len(step),
        "rollout_mean": statistics.mean(times["rollout"]),
        "rollout_max": max(times["rollout"]),
        "score_mean": statistics.mean(times["score"]),
        "train_mean": statistics.mean(times["train"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from roll.pipeline.tiny_model import main as build_model

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(["--preset", "frozen_lake", "--output_dir", f"{tmp}/micro", *MICRO])
        collect = collect_times(model, args.repeats)
        print(
            f"collect: {collect['objects']:,} tracked objects; a full collection {collect['off_ms']:.1f} ms, "
            f"{collect['on_ms']:.2f} ms after the freeze ({collect['left']:,} objects left to walk)",
            flush=True,
        )
        merged: dict[str, dict[str, list[float]]] = {"off": {}, "on": {}}
        for round_ in range(args.rounds):
            for mode in ("off", "on"):
                switch = {"ROLL_GC_FREEZE": "1" if mode == "on" else "0"}
                times = run_pipeline(model, Path(tmp) / f"{mode}-{round_}", args.steps, switch)
                for key, values in times.items():
                    merged[mode].setdefault(key, []).extend(values)
                print(f"round {round_ + 1} {mode}: step mean {statistics.mean(times['step']):.3f} s", flush=True)
    rows = {mode: summary(times) for mode, times in merged.items()}
    keys = list(rows["off"])
    load = load_span(load_before)
    print(f"\n{args.rounds} round(s) of {args.steps} steps each (steps 3+), {load}")
    print("| freeze | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for mode, row in rows.items():
        print(f"| {mode} | " + " | ".join(f"{row[k]:.3f}" for k in keys) + " |")
    ratio = {k: rows["off"][k] / rows["on"][k] for k in ("step_mean", "rollout_mean", "step_max")}
    print(
        f"RESULT gc_pauses collect_ms_off={collect['off_ms']:.1f} collect_ms_on={collect['on_ms']:.2f} "
        f"step_mean_ratio={ratio['step_mean']:.2f} rollout_mean_ratio={ratio['rollout_mean']:.2f} "
        f"step_max_ratio={ratio['step_max']:.2f}"
    )


if __name__ == "__main__":
    main()
