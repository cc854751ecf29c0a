"""Partial rollout on a long-tailed workload: what a weight sync does to the generations in flight.

Four runs of benchmarks/configs/long_tail_frozen_lake.yaml through the CLI, side by side: 1 group
in 10 answers 256 tokens a turn, the rest 32 (8x; `ignore_eos` fixes the lengths). Same seed,
model and batches; only the sync policy differs:
- sync: `async_generation_ratio: 0` (the reference);
- finish: k = 2, requests in flight end on the old weights, a step waits for its own groups (today);
- abort: k = 2, requests in flight are thrown away and generated again on the new weights, a step
  takes the groups that finish first (ROLL's behaviour);
- continue: k = 2, requests in flight stop at a token boundary and go on under the new weights,
  a step takes the groups that finish first (`partial_rollout: true`).
The async runs allow `--max_staleness` versions (a long group carries over several steps).
`--decode_delay_ms` > 0 stretches every decode step by that much without holding a core
(`ROLL_DECODE_DELAY_MS`): an engine on a device of its own, where 2 shared cores would otherwise
make the engine and the trainer slow each other down (on `vllm`, every engine step). `--engine
vllm` runs `actor_infer` on vLLM (run with the python of `scripts/install_vllm_cpu.sh`'s venv).
Modes alternate over `--repeats`.

    python benchmarks/rollout/partial_rollout.py [--steps 12 --decode_delay_ms 10 --max_staleness 8 --repeats 1]

Per mode: trajectories/s over steps 2..N (step 1 runs nothing ahead), the trainer's idle
fraction (`time/idle/actor_train` over `time/step_s`), the seconds a sync takes, requests
interrupted, tokens discarded, the mean token lag, the share of LongLake trajectories trained
(0.1 when no step favours the short ones) and the groups dropped as too stale.
The last line is `RESULT continue_over_finish=<x> continue_over_abort=<y> discarded_continue=<n>`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: import from this checkout
from benchmarks.common import REPO, load_line, result_line, tiny_model

MODES = {
    "sync": ["async_generation_ratio=0"],
    "finish": ["partial_rollout=false"],
    "abort": ["partial_rollout=abort"],
    "continue": ["partial_rollout=true"],
}


def run(mode: str, args, model: str, out: Path) -> list[dict]:
    """One training run; its metrics.jsonl rows."""
    cmd = [
        sys.executable,
        "examples/start_agentic_pipeline.py",
        "--config_path",
        "benchmarks/configs",
        "--config_name",
        "long_tail_frozen_lake",
        f"pretrain={model}",
        f"output_dir={out}",
        f"max_steps={args.steps}",
        f"+actor_infer.system_envs.ROLL_DECODE_DELAY_MS='{args.decode_delay_ms:g}'",
        f"actor_infer.strategy_args.strategy_name={args.engine}",
        *MODES[mode],
        *([f"+async_max_staleness={args.max_staleness}"] if mode != "sync" else []),
    ]
    print(f"running {mode} -> {out}", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{mode} failed:\n{proc.stderr[-3000:]}")
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def summarize(rows: list[dict], batch: int) -> dict[str, float]:
    steps = [r for r in rows if r["step"] > 1]
    wall = sum(r["time/step_s"] for r in steps)
    total = lambda key: sum(r.get(key, 0.0) for r in steps)  # noqa: E731
    return {
        "traj_per_s": batch * len(steps) / wall,
        "trainer_idle": statistics.fmean(r["time/idle/actor_train"] / r["time/step_s"] for r in steps),
        "engine_idle": statistics.fmean(r["time/idle/actor_infer"] / r["time/step_s"] for r in steps),
        "sync_s": statistics.fmean(r["time/sync_s"] for r in steps),
        "interrupted": total("rollout/interrupted_requests"),
        "discarded": total("rollout/discarded_tokens"),
        "token_lag": statistics.fmean(r["rollout/token_lag_mean"] for r in steps),
        "long_share": statistics.fmean(r.get("train/LongLake/share", 0.0) for r in steps),
        "stale_dropped": total("rollout/stale_dropped_groups"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--decode_delay_ms", type=float, default=10.0)
    parser.add_argument("--max_staleness", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--record", help="write the table as JSON here (e.g. benchmarks/results/...json)")
    args = parser.parse_args()
    modes = args.modes.split(",")
    load = os.getloadavg()
    results: dict[str, list[dict]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory() as tmp:
        model = str(tiny_model("frozen_lake", Path(tmp)))
        order = list(modes)
        for repeat in range(args.repeats):
            for mode in order:
                rows = run(mode, args, model, Path(tmp) / f"{mode}-{repeat}")
                results[mode].append(summarize(rows, batch=80))
            order.reverse()
    table = {mode: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for mode, runs in results.items()}
    print(
        f"long-tailed FrozenLake (32/256-token answers, 1 group in 10 long), {args.engine}, {args.steps} steps, "
        f"decode delay {args.decode_delay_ms:g} ms, max staleness {args.max_staleness}, {load_line(load=load)}, "
        f"{args.repeats} repeat(s)"
    )
    head = ("traj/s", "trainer idle", "engine idle", "sync s", "interrupted", "discarded", "token lag", "long share")
    print(f"{'mode':10}" + "".join(f"{h:>14}" for h in head))
    keys = (
        "traj_per_s",
        "trainer_idle",
        "engine_idle",
        "sync_s",
        "interrupted",
        "discarded",
        "token_lag",
        "long_share",
    )
    for mode, row in table.items():
        print(f"{mode:10}" + "".join(f"{row[k]:14.3f}" for k in keys))
    if args.record:
        record = {"date": str(date.today()), "load_average": load[0], "args": vars(args), "table": table}
        Path(args.record).write_text(json.dumps(record, indent=1) + "\n")
    if {"continue", "finish", "abort"} <= table.keys():
        c = table["continue"]["traj_per_s"]
        ratios = {
            "continue_over_finish": c / table["finish"]["traj_per_s"],
            "continue_over_abort": c / table["abort"]["traj_per_s"],
            "discarded_continue": table["continue"]["discarded"],
        }
        print(result_line("", ratios, digits={"discarded_continue": 0}))


if __name__ == "__main__":
    main()
