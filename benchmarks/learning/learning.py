"""Learning curves of the examples: validation success (WebShop: score) against wall time and env
steps, N seeds (vl_frozen_lake: the VL example, FrozenLake seen only as images; vl_frozen_lake_step:
its step-wise GiGPO variant).

Each (env, seed) is one run of the example's config through the CLI, exactly what a user runs,
with only `seed` and `output_dir` changed (and `max_steps` / `eval_steps` when given), so the
curve is the example's own. Runs are deterministic on CPU; a finished run is reused from its
`metrics.jsonl`.

Per env, the seeds' curves are aligned on the validation steps (every run of one env validates at
the same steps) and reduced to the mean and a 95% confidence band of the mean (Student t over the
seeds). Two x axes:
- wall time: the running sum of `time/step_s` (rollout + score + train + sync; validation and
  start-up are left out), averaged over the seeds at each validation step;
- env steps: the running sum of actions taken in training rollouts (`train/num_actions` times
  `rollout/kept_trajectories`), likewise averaged.

Writes one PNG (a row per env: success vs wall time, success vs env steps) and prints a markdown
table; the last line is machine-readable: `RESULT <env>_final=<mean> <env>_ci95=<half width> ...`.

    python benchmarks/learning/learning.py [--envs frozen_lake sokoban webshop vl_frozen_lake vl_frozen_lake_step]
        [--seeds 1 2 3] [--steps N] [--eval_steps K] [--out DIR] [--plot PATH] [--extra key=value ...]

Smoke check (about 2 minutes on 2 cores): `--envs frozen_lake --seeds 1 2 --steps 2 --eval_steps 1`.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: import from this checkout
from benchmarks.common import REPO, tiny_model

# env -> (config dir, config name, tiny-model preset)
ENVS = {
    "frozen_lake": ("frozen_lake", "agent_val_frozen_lake", "frozen_lake"),
    "sokoban": ("sokoban", "agent_val_sokoban", "sokoban"),
    "webshop": ("webshop", "agent_val_webshop", "webshop"),
    "vl_frozen_lake": ("vl_frozen_lake", "agentic_val_vl_frozen_lake", "vl_frozen_lake"),
    "vl_frozen_lake_step": ("vl_frozen_lake", "agentic_val_vl_frozen_lake_step", "vl_frozen_lake"),
}
# env -> the validation metric of its curve: success, or WebShop's score (the paper's mean purchase
# reward: success alone is all-or-nothing, 1.0 only for the right product with every option)
METRIC = {
    "frozen_lake": "val/success",
    "sokoban": "val/success",
    "webshop": "val/env/score",
    "vl_frozen_lake": "val/success",
    "vl_frozen_lake_step": "val/success",
}
# envs whose tiny model gets the example's warm start (`roll.pipeline.warm_start`) before RL
WARM_START = {"webshop"}
# two-sided 95% Student t quantiles t_{0.975, df} for df = 1..10; larger df use the normal 1.96
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


@dataclass(frozen=True)
class Point:
    """One validation of one run: after `step` training steps, `wall_s` training seconds and
    `env_steps` training actions, the greedy validation metric `success` (`METRIC`: success, or
    WebShop's score)."""

    step: int
    wall_s: float
    env_steps: float
    success: float


@dataclass(frozen=True)
class Band:
    """The seeds at one validation step: mean x (wall s, env steps), mean success, the 95%
    confidence interval of the mean [low, high], the seeds' min and max."""

    step: int
    wall_s: float
    env_steps: float
    mean: float
    low: float
    high: float
    minimum: float
    maximum: float


def t975(df: int) -> float:
    """Two-sided 95% Student t quantile for `df` degrees of freedom (>= 1)."""
    return _T975[df - 1] if df <= len(_T975) else 1.96


def mean_ci95(values: list[float]) -> tuple[float, float]:
    """(mean, half width of its 95% confidence interval): t * sample std / sqrt(n); 0 for n = 1."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, t975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))


def curve(records: list[dict], metric: str = "val/success") -> list[Point]:
    """The validation points (`metric`) of one run's metrics.jsonl records (in step order)."""
    points, wall, env_steps = [], 0.0, 0.0
    for record in records:
        wall += record.get("time/step_s", 0.0)
        env_steps += record.get("train/num_actions", 0.0) * record.get("rollout/kept_trajectories", 0.0)
        if metric in record:
            points.append(Point(int(record["step"]), wall, env_steps, float(record[metric])))
    return points


def aggregate(curves: list[list[Point]]) -> list[Band]:
    """Seeds' curves -> one Band per validation step that every curve has (a shorter run ends the
    band there)."""
    by_step = [{p.step: p for p in c} for c in curves]
    common = sorted(set.intersection(*(set(d) for d in by_step))) if by_step else []
    bands = []
    for step in common:
        points = [d[step] for d in by_step]
        values = [p.success for p in points]
        mean, half = mean_ci95(values)
        bands.append(
            Band(
                step,
                statistics.fmean(p.wall_s for p in points),
                statistics.fmean(p.env_steps for p in points),
                mean,
                mean - half,
                mean + half,
                min(values),
                max(values),
            )
        )
    return bands


def build_model(env: str, out: Path) -> Path:
    """The example's model: the tiny model of its preset, warm-started for `WARM_START` envs (as
    the example's run script builds it; a warm model already built is reused)."""
    config_path, config_name, preset = ENVS[env]
    path = tiny_model(preset, out)
    if env not in WARM_START:
        return path
    warm_path = out / "models" / f"tiny-{preset}-warm"
    if not (warm_path / "warm_start.json").exists():
        print(f"warm-starting {preset} ...", file=sys.stderr, flush=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "roll.pipeline.warm_start",
                "--config_path",
                config_path,
                "--config_name",
                config_name,
                "--output_dir",
                str(warm_path),
                f"pretrain={path}",
            ],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
    return warm_path


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def run(env: str, seed: int, model: Path, out: Path, overrides: list[str]) -> tuple[list[dict], float | None]:
    """One training run: its metrics records and the process's wall seconds (None: reused)."""
    run_dir = out / f"{env}-seed{seed}"
    done = run_dir / "done.json"
    if done.exists() and json.loads(done.read_text())["overrides"] == overrides:
        return read_records(run_dir / "metrics.jsonl"), json.loads(done.read_text())["wall_s"]
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
        f"seed={seed}",
        "save_steps=0",
        "resume_from_checkpoint=false",
        "overwrite_output_dir=true",
        *overrides,
    ]
    print(f"running {env} seed {seed} ...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{env} seed {seed} failed:\n{proc.stderr[-2000:]}")
    done.write_text(json.dumps({"overrides": overrides, "wall_s": wall}))
    return read_records(run_dir / "metrics.jsonl"), wall


def plot(results: dict[str, list[Band]], path: Path) -> None:
    from matplotlib.figure import Figure  # a bare Figure renders with Agg

    fig = Figure(figsize=(10, 3.2 * len(results)), layout="constrained")
    axes = fig.subplots(len(results), 2, squeeze=False)
    for row, (env, bands) in zip(axes, results.items()):
        for ax, (attr, label) in zip(row, (("wall_s", "training wall time (s)"), ("env_steps", "env steps"))):
            xs = [getattr(b, attr) for b in bands]
            ax.plot(xs, [b.mean for b in bands], marker="o", markersize=3, label="mean")
            ax.fill_between(
                xs,
                [max(b.low, 0.0) for b in bands],
                [min(b.high, 1.0) for b in bands],
                alpha=0.25,
                label="95% CI (cut to [0, 1])",
            )
            ax.plot(xs, [b.minimum for b in bands], ":", color="gray", linewidth=0.8, label="seed min/max")
            ax.plot(xs, [b.maximum for b in bands], ":", color="gray", linewidth=0.8)
            ax.set(xlabel=label, ylabel=METRIC[env], title=env, ylim=(-0.02, 1.02))
            ax.grid(alpha=0.3)
        row[0].legend(loc="lower right", fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", choices=sorted(ENVS), default=list(ENVS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=None, help="max_steps (default: the example's)")
    parser.add_argument("--eval_steps", type=int, default=None, help="eval_steps (default: the example's)")
    parser.add_argument("--extra", nargs="*", default=[], help="more hydra overrides for every run")
    parser.add_argument("--out", type=Path, default=REPO / "output" / "bench_learning")
    parser.add_argument("--plot", type=Path, default=REPO / "benchmarks" / "learning.png")
    args = parser.parse_args()
    overrides = [
        *([f"max_steps={args.steps}"] if args.steps else []),
        *([f"eval_steps={args.eval_steps}"] if args.eval_steps else []),
        *args.extra,
    ]

    results, table, result = {}, [], []
    for env in args.envs:
        model = build_model(env, args.out)
        runs = [run(env, seed, model, args.out, overrides) for seed in args.seeds]
        curves = [curve(records, METRIC[env]) for records, _ in runs]
        bands = aggregate(curves)
        results[env] = bands
        last = bands[-1]
        finals = [c[-1].success for c in curves]
        mean, half = mean_ci95(finals)
        walls = [w for _, w in runs if w is not None]
        table.append(
            (
                env,
                len(args.seeds),
                last.step,
                f"{bands[0].mean:.3f}",
                f"{mean:.3f} ± {half:.3f}",
                " ".join(f"{v:.3f}" for v in finals),
                f"{max(b.mean for b in bands):.3f}",
                f"{last.wall_s:.0f}",
                f"{statistics.fmean(walls):.0f}" if walls else "reused",
                f"{last.env_steps:,.0f}",
            )
        )
        result += [f"{env}_final={mean:.3f}", f"{env}_ci95={half:.3f}"]
    plot(results, args.plot)

    header = (
        "env",
        "seeds",
        "steps",
        "val metric at 0",
        "final (mean ± 95% CI)",
        "per seed",
        "best mean",
        "train s",
        "run wall s",
        "env steps",
    )
    print(f"overrides: {' '.join(overrides) or '(the examples as shipped)'}; plot: {args.plot}")
    for row in (header, tuple("---" for _ in header), *table):
        print("| " + " | ".join(str(cell) for cell in row) + " |")
    print("RESULT " + " ".join(result))


if __name__ == "__main__":
    main()
