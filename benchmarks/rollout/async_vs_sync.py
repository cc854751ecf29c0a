"""Async vs synchronous training: wall time per step and the learning curve, k = 0 and k = 1.

Each mode is one run of the FrozenLake example through the CLI (exactly what a user runs), with
only `async_generation_ratio` changed (and, for k > 0, token-level truncated importance
weights, `off_policy_correction.level=token`): the same seed, model, batch sizes, learning-rate
schedule and validation maps. With k = 1 the groups of step t+1 start as soon as step t's are
collected and generate while step t scores and trains; the rollout of step t+1 then mostly waits
for what is left of them.

`--median_ms` > 0 swaps FrozenLake for `benchmarks.rollout.latency_env:SlowFrozenLakeEnv` (every
`env.step` sleeps a log-normal time with that median, as a remote env or a tool call would):
rollout is then bound by env latency, the case async training is for. With `--median_ms 0`
rollout and training compete for the same CPU cores, so overlapping them can only hide the idle
moments of each. `--decode_delay_ms 0,10` runs both modes at each engine delay
(`ROLL_DECODE_DELAY_MS`: each decode step after the first token sleeps that long, holding no core,
as on an inference device of its own). Runs alternate over `--repeats`, so load from other
processes hits all; the table takes each run's median step time over its repeats.

    python benchmarks/rollout/async_vs_sync.py [--steps 30 --eval_steps 10 --median_ms 50 --decode_delay_ms 0
        --repeats 1]

Printed per run: mean seconds a step (step 1 excluded: nothing runs ahead of it), its rollout,
train and sync parts, staleness, validation success; per delay the speedup, and what separate
inference and training devices would give at the sync run's phase speeds (sync step / the longer
of rollout and the rest). Last: `RESULT async_speedup=<x> val_success_sync=<y>
val_success_async=<z>`, each with a `_delay<ms>` suffix when there are several delays.
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
from benchmarks.common import REPO, load_line, result_line, tiny_model

LATENCY_ENV = "benchmarks.rollout.latency_env:SlowFrozenLakeEnv"
DECODE_DELAY_VAR = "ROLL_DECODE_DELAY_MS"  # roll/distributed/strategies/engine_api.py
MODES = {
    "sync (k=0)": ["async_generation_ratio=0"],
    "async (k=1)": ["async_generation_ratio=1", "off_policy_correction.level=token"],
}


def run(mode: str, delay_ms: float, args, model: str, out: Path) -> list[dict]:
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
        *([f"+actor_infer.system_envs.{DECODE_DELAY_VAR}='{delay_ms:g}'"] if delay_ms > 0 else []),
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
        "sync_s": mean("time/sync_s"),
        "staleness": mean("rollout/staleness_mean"),
        "val": [(r["step"], r["val/success"]) for r in rows if "val/success" in r],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--eval_steps", type=int, default=10)
    parser.add_argument("--val_maps", type=int, default=128, help="validation maps (greedy)")
    parser.add_argument("--median_ms", type=float, default=50.0, help="env.step latency; 0: plain FrozenLake")
    parser.add_argument(
        "--decode_delay_ms",
        type=lambda text: [float(x) for x in text.split(",")],
        default=[0.0],
        help="engine delays to run both modes at, e.g. 0,10",
    )
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    load = os.getloadavg()
    runs = [(mode, delay) for delay in args.decode_delay_ms for mode in MODES]
    results: dict[tuple[str, float], list[dict]] = {key: [] for key in runs}
    with tempfile.TemporaryDirectory() as tmp:
        model = str(tiny_model("frozen_lake", Path(tmp)))
        order = list(runs)
        for repeat in range(args.repeats):
            for mode, delay in order:
                out = Path(tmp) / f"{mode.split()[0]}-{delay:g}-{repeat}"
                results[mode, delay].append(summarize(run(mode, delay, args, model, out)))
            order.reverse()
    print(
        f"FrozenLake step-wise example, {args.steps} steps, env.step latency median {args.median_ms:g} ms, "
        f"{load_line(load=load)}, {args.repeats} repeat(s)"
    )
    print_table(results)


def print_table(results: dict[tuple[str, float], list[dict]]) -> None:
    """One row per (mode, delay): medians over repeats; then the speedups and the RESULT line."""
    print(
        f"{'mode':13}{'delay ms':>9}{'step s':>8}{'rollout s':>11}{'train s':>9}{'sync s':>8}{'staleness':>11}"
        "  val success (step: value)"
    )
    median = lambda runs, key: statistics.median(r[key] for r in runs)  # noqa: E731
    step_s = {}
    for (mode, delay), runs in results.items():
        step_s[mode, delay] = median(runs, "step_s")
        rollout, train, sync = (median(runs, k) for k in ("rollout_s", "train_s", "sync_s"))
        curve = " ".join(f"{s}:{v:.3f}" for s, v in runs[0]["val"])
        print(
            f"{mode:13}{delay:9g}{step_s[mode, delay]:8.2f}{rollout:11.2f}{train:9.2f}{sync:8.2f}"
            f"{runs[0]['staleness']:11.2f}  {curve}"
        )
    sync_mode, async_mode = MODES
    delays = list(dict.fromkeys(delay for _, delay in results))
    fields: dict[str, float] = {}
    for delay in delays:
        suffix = f"_delay{delay:g}" if len(delays) > 1 else ""
        speedup = step_s[sync_mode, delay] / step_s[async_mode, delay]
        # separate devices, each side at the sync run's speed: the async step is the longer side
        sync_runs = results[sync_mode, delay]
        rollout = median(sync_runs, "rollout_s")
        on_devices = step_s[sync_mode, delay] / max(rollout, step_s[sync_mode, delay] - rollout)
        print(f"delay {delay:g} ms: async {speedup:.2f}x sync; on separate devices (from the phases) {on_devices:.2f}x")
        vals = [results[mode, delay][0]["val"][-1][1] for mode in MODES]
        fields[f"async_speedup{suffix}"] = speedup
        fields[f"val_success_sync{suffix}"] = vals[0]
        fields[f"val_success_async{suffix}"] = vals[1]
    print(result_line("", fields, digits={key: 3 for key in fields if key.startswith("val_success")}))


if __name__ == "__main__":
    main()
