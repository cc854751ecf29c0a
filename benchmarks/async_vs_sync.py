"""Async vs synchronous training: wall time per step and the learning curve, k = 0 and k = 1.

Each mode is one run of the FrozenLake example through the CLI (exactly what a user runs), with
only `async_generation_ratio` changed (and, for k > 0, token-level truncated importance
weights, `off_policy_correction.level=token`): the same seed, model, batch sizes, learning-rate
schedule and validation maps. With k = 1 the groups of step t+1 start as soon as step t's are
collected and generate while step t scores and trains; the rollout of step t+1 then mostly waits
for what is left of them.

`--median_ms` > 0 swaps FrozenLake for `benchmarks.latency_env:SlowFrozenLakeEnv` (every
`env.step` sleeps a log-normal time with that median, as a remote env or a tool call would):
rollout is then bound by env latency, the case async training is for. With `--median_ms 0`
rollout and training compete for the same CPU cores, so overlapping them can only hide the idle
moments of each. Runs alternate between modes over `--repeats`, so load from other processes
hits both; the table takes each mode's median step time over its repeats.

    python benchmarks/async_vs_sync.py [--steps 30 --eval_steps 10 --median_ms 50 --repeats 1]

Printed: per mode the mean wall seconds per step (step 1, which runs nothing ahead, excluded),
its rollout / train parts, the mean staleness, the validation success at each evaluation, and the
last line `RESULT async_speedup=<sync step s / async step s> val_success_sync=<x> val_success_async=<y>`.
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

REPO = Path(__file__).resolve().parent.parent
LATENCY_ENV = "benchmarks.latency_env:SlowFrozenLakeEnv"
MODES = {
    "sync (k=0)": ["async_generation_ratio=0"],
    "async (k=1)": ["async_generation_ratio=1", "off_policy_correction.level=token"],
}


def run(mode: str, args, model: str, out: Path) -> list[dict]:
    """One training run; its metrics.jsonl rows."""
    env = "custom_envs.FrozenLake"
    latency = [f"{env}.env_type='{LATENCY_ENV}'", f"{env}.env_config.median_ms={args.median_ms}"]
    cmd = [
        sys.executable,
        "examples/start_agentic_pipeline.py",
        "--config_path",
        "frozen_lake",
        "--config_name",
        "agent_val_frozen_lake",
        f"pretrain={model}",
        f"output_dir={out}",
        f"max_steps={args.steps}",
        f"eval_steps={args.eval_steps}",
        "save_steps=0",
        f"val_batch_size={args.val_maps}",
        f"val_env_manager.num_env_groups={args.val_maps}",
        *MODES[mode],
        *(latency if args.median_ms > 0 else []),
    ]
    env_vars = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    print(f"running {mode} -> {out}", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env_vars)
    if proc.returncode != 0:
        sys.exit(f"{mode} failed:\n{proc.stderr[-3000:]}")
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def summarize(rows: list[dict]) -> dict:
    steps = [r for r in rows if r["step"] > 1]  # step 1 has nothing generated ahead of it
    mean = lambda key: statistics.fmean(r[key] for r in steps)  # noqa: E731
    return {
        "step_s": mean("time/step_s"),
        "rollout_s": mean("time/rollout_s"),
        "train_s": mean("time/train_s"),
        "staleness": mean("rollout/staleness_mean"),
        "val": [(r["step"], r["val/success"]) for r in rows if "val/success" in r],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--eval_steps", type=int, default=10)
    parser.add_argument("--val_maps", type=int, default=128, help="validation maps (greedy)")
    parser.add_argument("--median_ms", type=float, default=50.0, help="env.step latency; 0: plain FrozenLake")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    load = os.getloadavg()
    results: dict[str, list[dict]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "roll.pipeline.tiny_model",
                "--preset",
                "frozen_lake",
                "--output_dir",
                f"{tmp}/model",
            ],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
        order = list(MODES)
        for repeat in range(args.repeats):
            for mode in order:
                rows = run(mode, args, f"{tmp}/model", Path(tmp) / f"{mode.split()[0]}-{repeat}")
                results[mode].append(summarize(rows))
            order.reverse()
    print(
        f"FrozenLake step-wise example, {args.steps} steps, env.step latency median {args.median_ms:g} ms, "
        f"{os.cpu_count()} cores, load average {load[0]:.2f} at start, {args.repeats} repeat(s)"
    )
    print(f"{'mode':13}{'step s':>8}{'rollout s':>11}{'train s':>9}{'staleness':>11}  val success (step: value)")
    median_step_s = {}
    for mode, runs in results.items():
        step_s = statistics.median(r["step_s"] for r in runs)
        median_step_s[mode] = step_s
        first = runs[0]
        curve = " ".join(f"{s}:{v:.3f}" for s, v in first["val"])
        print(
            f"{mode:13}{step_s:8.2f}{statistics.median(r['rollout_s'] for r in runs):11.2f}"
            f"{statistics.median(r['train_s'] for r in runs):9.2f}{first['staleness']:11.2f}  {curve}"
        )
    sync, async_ = (results[m][0]["val"][-1][1] for m in MODES)
    print(
        f"RESULT async_speedup={median_step_s['sync (k=0)'] / median_step_s['async (k=1)']:.2f} "
        f"val_success_sync={sync:.3f} val_success_async={async_:.3f}"
    )


if __name__ == "__main__":
    main()
