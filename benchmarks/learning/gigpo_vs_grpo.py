"""Step-wise GRPO vs GiGPO with the tiny model, at equal env steps, several seeds, one table.

Each (env, estimator, seed) is one run of the example config through the CLI, exactly what a user
runs, with only `adv_estimator` and `seed` changed, so both estimators see the same number of
trajectories per step, the same learning-rate schedule and the same validation set (greedy, fixed
maps/rooms). The runs are deterministic on CPU, so a cell is reproducible from its seed.

Reported per (env, estimator): final validation success (mean ± std over seeds, and each seed),
the best validation success seen during the run, and the anchor-group statistics of the training
batches (`critic/anchor_nonsingleton_frac`: the fraction of step rows that share their state with
another row of their group, the only rows GiGPO's step advantage can touch), averaged over steps.

    python benchmarks/learning/gigpo_vs_grpo.py [--envs frozen_lake sokoban] [--seeds 1 2 3] [--steps 60]

Cost on 2 quiet CPU cores (measured): a FrozenLake run about 7 minutes, a Sokoban run about 15
(the early steps, with long random episodes, cost most), so the defaults (12 runs of 60 steps)
take about 2 hours and `--envs frozen_lake` about 45 minutes; beside other jobs, 2-3x that. The last line is
machine-readable:
`RESULT <env>_gigpo_minus_grpo=<x> ...` (difference of mean final success).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: import from this checkout
from benchmarks.common import REPO, tiny_model

# env -> (config dir, config name, tiny-model preset)
ENVS = {
    "frozen_lake": ("frozen_lake", "agent_val_frozen_lake", "frozen_lake"),
    "sokoban": ("sokoban", "agent_val_sokoban", "sokoban"),
}
ESTIMATORS = ("grpo", "gigpo")


def run(env: str, estimator: str, seed: int, steps: int, eval_steps: int, model: Path, out: Path) -> list[dict]:
    """One training run; its metrics.jsonl rows (reused when the run already finished)."""
    run_dir = out / f"{env}-{estimator}-seed{seed}"
    metrics = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    if not rows or rows[-1]["step"] != steps:
        config_path, config_name, _ = ENVS[env]
        cmd = [
            sys.executable,
            "examples/start_agentic_pipeline.py",
            "--config_path",
            config_path,
            "--config_name",
            config_name,
            f"pretrain={model}",
            f"output_dir={run_dir}",
            f"adv_estimator={estimator}",
            f"seed={seed}",
            f"max_steps={steps}",
            f"eval_steps={eval_steps}",
            "save_steps=0",
            "resume_from_checkpoint=false",
        ]
        print(f"running {env} {estimator} seed {seed} ...", file=sys.stderr, flush=True)
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"{env} {estimator} seed {seed} failed:\n{proc.stderr[-2000:]}")
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    return rows


def summarize(rows: list[dict]) -> dict[str, float]:
    val = [r["val/success"] for r in rows if "val/success" in r]
    anchors = [r["critic/anchor_nonsingleton_frac"] for r in rows if "critic/anchor_nonsingleton_frac" in r]
    return {"final": val[-1], "best": max(val), "anchor": statistics.fmean(anchors) if anchors else float("nan")}


def mean_std(values: list[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.3f} ± {std:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", choices=sorted(ENVS), default=list(ENVS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--eval_steps", type=int, default=10)
    parser.add_argument("--out", type=Path, default=REPO / "output" / "bench_gigpo_vs_grpo")
    args = parser.parse_args()

    table, result = [], []
    for env in args.envs:
        model = tiny_model(ENVS[env][2], args.out)
        finals = {}
        for estimator in ESTIMATORS:
            cells = [
                summarize(run(env, estimator, s, args.steps, args.eval_steps, model, args.out)) for s in args.seeds
            ]
            finals[estimator] = statistics.fmean(c["final"] for c in cells)
            table.append(
                (
                    env,
                    estimator,
                    mean_std([c["final"] for c in cells]),
                    " ".join(f"{c['final']:.3f}" for c in cells),
                    mean_std([c["best"] for c in cells]),
                    f"{statistics.fmean(c['anchor'] for c in cells):.3f}",
                )
            )
        result.append(f"{env}_gigpo_minus_grpo={finals['gigpo'] - finals['grpo']:+.3f}")

    header = ("env", "estimator", "final val success", "per seed", "best val success", "anchor rows")
    widths = [max(len(str(row[i])) for row in [header, *table]) for i in range(len(header))]
    print(f"{args.steps} training steps per run, seeds {args.seeds}")
    for row in [header, *table]:
        print(" | ".join(str(cell).ljust(w) for cell, w in zip(row, widths)))
    print("RESULT " + " ".join(result))


if __name__ == "__main__":
    main()
