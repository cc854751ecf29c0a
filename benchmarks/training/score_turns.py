"""The score phase of a CPU run with a reference role: the actor's and the reference's log-prob
passes at once vs in turns (`roll.pipeline.setup.cpu_shares.score_in_turns`, on by default on one CPU
machine; `ROLL_SCORE_IN_TURNS=0` turns it off).

The README's FrozenLake example with a KL loss to a reference role (`hf_infer`), the tiny model,
every role with torch's default threads (all cores), validation and checkpoints off. `--rounds`
runs at once and in turns, alternating; each runs `--steps` steps, of which steps 1-2 (warm-up)
are left out. `--micro` uses a model too small to cost anything (hidden 16, one layer), so that a
pass is only its overhead, as on a GPU.

    python benchmarks/training/score_turns.py [--steps 12 --rounds 2 --micro]

The last line is `RESULT score_turns score_mean_ratio=<at once / in turns> score_max_ratio=<..>
step_mean_ratio=<..>`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: import from this checkout
from benchmarks.common import REPO, load_span, result_line
from benchmarks.host.gc_pauses import MICRO, run_pipeline

WITH_REFERENCE = [
    "use_kl_loss=true",
    "kl_loss_coef=0.001",
    "+reference.strategy_args.strategy_name=hf_infer",
    "save_steps=0",
    "eval_steps=1000",
]
MODES = {"at_once": {"ROLL_SCORE_IN_TURNS": "0"}, "in_turns": {"ROLL_SCORE_IN_TURNS": "1"}}


def summary(times: dict[str, list[float]]) -> dict[str, float]:
    return {
        "score_mean": statistics.mean(times["score"]),
        "score_median": statistics.median(times["score"]),
        "score_max": max(times["score"]),
        "train_mean": statistics.mean(times["train"]),
        "step_mean": statistics.mean(times["step"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--micro", action="store_true", help="the hidden-16 one-layer model instead of the tiny one")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from roll.pipeline.tiny_model import main as build_model

    load_before = os.getloadavg()[0]
    merged: dict[str, dict[str, list[float]]] = {mode: {} for mode in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(["--preset", "frozen_lake", "--output_dir", f"{tmp}/model", *(MICRO if args.micro else [])])
        for round_ in range(args.rounds):
            for mode, switches in MODES.items():
                out = Path(tmp) / f"{mode}-{round_}"
                times = run_pipeline(model, out, args.steps, switches, WITH_REFERENCE)
                for key, values in times.items():
                    merged[mode].setdefault(key, []).extend(values)
                print(f"round {round_ + 1} {mode}: score mean {statistics.mean(times['score']):.3f} s", flush=True)
    rows = {mode: summary(times) for mode, times in merged.items()}
    keys = list(rows["at_once"])
    model_name = "micro (hidden 16, 1 layer)" if args.micro else "tiny"
    load = load_span(load_before)
    print(f"\n{model_name}; {args.rounds} round(s) of {args.steps} steps (steps 3+), {load}; {os.cpu_count()} cores")
    print("| passes | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for mode, row in rows.items():
        print(f"| {mode} | " + " | ".join(f"{row[k]:.3f}" for k in keys) + " |")
    ratio = {k: rows["at_once"][k] / rows["in_turns"][k] for k in ("score_mean", "score_max", "step_mean")}
    print(result_line("score_turns", {f"{k}_ratio": v for k, v in ratio.items()}))


if __name__ == "__main__":
    main()
