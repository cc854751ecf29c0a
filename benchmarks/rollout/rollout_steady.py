"""Steady-state rollout for `rollout_throughput.py --steady_batches N`: trajectories/s of a rollout
that never drains between batches, with env latency against the zero-latency bound.

One batch is collected the way the async pipeline collects a step with partial rollout
(`AgenticPipeline.rollout`): the batch's groups and those of the next k batches (k =
`async_generation_ratio`, `--ahead`) are dispatched, and `collect(first_done=True)` takes the first
groups to finish; the others keep running, so every env-group slot stays busy across batches.
Nothing trains between batches. k = 0 drains at every batch (the fixed collection, its tail
included). Batch 1 fills the pipe and is not timed: trajectories/s are over batches 2..N. After
batch N the groups dispatched ahead are collected, untimed, so the next run starts on an idle
engine. Runs alternate: for each repeat, each k, both modes on the same groups, the order rotating.

Beside each run: the engine's forwards (prefill calls + decode steps), rows per forward and busy
fraction (its compute seconds over the run's). The engine curve (`--engine_sweep`) plays B
zero-latency episodes batch-synchronously for each B and gives the engine's rows/s at that batch
size: whether its throughput depends on how many requests each forward carries.
The method and every run: benchmarks/results/rollout_throughput.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import psutil
import ray

CURVE_STEP = 1_000_000
"""The engine curve's groups are those of steps from here on: none of the timed runs' groups."""


@dataclasses.dataclass
class SteadyRun:
    """One mode's run over batches 2..N: what it produced, and what the engine did meanwhile."""

    mode: str
    ahead: int
    seconds: float
    trajectories: int
    generated_tokens: int
    env_steps: int
    requests: int
    forwards: int  # prefill calls + decode steps of the engine
    engine_busy_s: float  # the inference worker's compute seconds
    prefill_tokens: int = 0  # new (not KV-reused) prompt ids prefilled, padding not counted
    cpu_s: dict[str, float] = dataclasses.field(default_factory=dict)  # CPU seconds: engine, env workers, driver

    @property
    def traj_per_s(self) -> float:
        return self.trajectories / self.seconds

    @property
    def rows_per_forward(self) -> float:
        return self.requests / max(self.forwards, 1)

    @property
    def busy(self) -> float:
        return self.engine_busy_s / self.seconds

    @property
    def rows_per_busy_s(self) -> float:
        """The engine's requests per second of compute: its speed at this run's batch mix."""
        return self.requests / max(self.engine_busy_s, 1e-9)


def process_ids(schedulers: dict, inference) -> dict[str, list[int]]:
    """The processes whose CPU seconds a run reports: the engine, every env worker, this driver."""
    pid = lambda actor: actor.__ray_call__.remote(lambda self: os.getpid())  # noqa: E731
    envs = [pid(worker) for scheduler in schedulers.values() for worker in scheduler.workers]
    return {"engine": [ray.get(pid(inference))], "env": ray.get(envs), "driver": [os.getpid()]}


def cpu_seconds(pids: dict[str, list[int]]) -> dict[str, float]:
    """User + system CPU seconds so far of each group of processes."""
    return {name: sum(sum(psutil.Process(p).cpu_times()[:2]) for p in group) for name, group in pids.items()}


def engine_snapshot(inference) -> dict[str, float]:
    """The inference worker's cumulative requests, forwards and compute seconds."""
    stats, clock = ray.get([inference.get_stats.remote(), inference.work_seconds.remote()])
    return {
        "requests": stats["requests"],
        "forwards": stats.get("prefill_calls", 0) + stats.get("decode_steps", 0),
        "prefill_tokens": stats.get("prefill_tokens", 0),
        "busy_s": clock["compute"],
    }


def collect_batch(scheduler, batch: int, num_groups: int, ahead: int) -> list:
    """Batch `batch` as the async pipeline takes a step with partial rollout: its groups and the
    next `ahead` batches' dispatched (a batch already dispatched is left as it is), then the first
    `num_groups` to finish."""
    for b in range(batch, batch + ahead + 1):
        scheduler.dispatch(b, num_groups)
    trajs, dropped = scheduler.collect(batch, num_groups, first_done=True)
    if dropped:
        raise RuntimeError(f"batch {batch}: {len(dropped)} trajectories dropped, e.g. {dropped[0]}")
    return trajs


def steady_run(
    mode: str, scheduler, inference, first: int, batches: int, num_groups: int, ahead: int, pids: dict | None = None
) -> SteadyRun:
    """Batches first..first+batches-1, timed from the end of the first; then the groups dispatched
    ahead are collected (untimed) so that nothing of this run is left running."""
    collect_batch(scheduler, first, num_groups, ahead)
    cpu = cpu_seconds(pids) if pids else {}
    before, start = engine_snapshot(inference), time.perf_counter()
    trajs = [t for b in range(first + 1, first + batches) for t in collect_batch(scheduler, b, num_groups, ahead)]
    seconds = time.perf_counter() - start
    after = engine_snapshot(inference)
    cpu = {name: used - cpu[name] for name, used in cpu_seconds(pids).items()} if pids else {}
    for b in range(first + batches, first + batches + ahead):
        collect_batch(scheduler, b, num_groups, 0)
    return SteadyRun(
        mode,
        ahead,
        seconds,
        len(trajs),
        sum(t.num_generated_tokens for t in trajs),
        sum(t.num_actions for t in trajs),
        int(after["requests"] - before["requests"]),
        int(after["forwards"] - before["forwards"]),
        after["busy_s"] - before["busy_s"],
        int(after["prefill_tokens"] - before["prefill_tokens"]),
        cpu,
    )


def measure_steady(args, schedulers: dict, inference) -> list[SteadyRun]:
    """Every (k, mode) once per repeat, the modes of one k on the same groups, the order rotating."""
    num_groups = args.trajectories // args.group_size
    for scheduler in schedulers.values():
        scheduler.collect(0, min(num_groups, 4))  # actor start-up, first calls: untimed
    runs, modes, pids = [], list(schedulers), process_ids(schedulers, inference)
    for repeat in range(args.repeats):
        for i, ahead in enumerate(args.ahead):
            first = 1 + (repeat * len(args.ahead) + i) * (args.steady_batches + max(args.ahead) + 1)
            for mode in modes:
                scheduler = schedulers[mode]
                run = steady_run(mode, scheduler, inference, first, args.steady_batches, num_groups, ahead, pids)
                runs.append(run)
                print(f"repeat {repeat + 1} k={ahead} {mode}: {run.traj_per_s:.1f} traj/s", flush=True)
            modes = modes[1:] + modes[:1]
    return runs


def engine_curve(sync, scheduler, sizes: list[int], tries: int = 2) -> list[dict]:
    """For each batch size B: B zero-latency episodes played batch-synchronously (`sync`, a
    `SyncRollout` of the bound's config with at least max(sizes) envs), `tries` times on new
    groups: requests per forward and the engine's rows/s (requests over seconds in
    `generate_many`), the best try's."""
    curve = []
    for i, size in enumerate(sizes):
        points = []
        for t in range(tries):
            groups = -(-size // sync.group_size)
            specs = [scheduler.group_spec(CURVE_STEP + i * tries + t, j, False) for j in range(groups)]
            episodes = [spec.episode(m) for spec in specs for m in range(sync.group_size)][:size]
            sync.generate_s = 0.0
            before = engine_snapshot(sync.inference)
            sync._play_batch(episodes)
            after = engine_snapshot(sync.inference)
            rows, forwards = after["requests"] - before["requests"], after["forwards"] - before["forwards"]
            points.append(
                {
                    "batch": size,
                    "forwards": int(forwards),
                    "rows_per_call": rows / max(forwards, 1),
                    "rows_per_s": rows / sync.generate_s,
                }
            )
        curve.append(max(points, key=lambda p: p["rows_per_s"]))
    return curve


def rows_per_s_at(curve: list[dict], rows: float) -> float:
    """The curve's rows/s at `rows` requests per call, interpolated linearly between its points."""
    points = sorted((c["rows_per_call"], c["rows_per_s"]) for c in curve)
    if rows <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if rows <= x1:
            return y0 + (y1 - y0) * (rows - x0) / (x1 - x0)
    return points[-1][1]


def summarize(runs: list[SteadyRun]) -> dict[int, dict[str, SteadyRun]]:
    """Per k and mode, the run with the median trajectories/s (the lower middle of an even count)."""
    table: dict[int, dict[str, SteadyRun]] = {}
    for ahead in dict.fromkeys(r.ahead for r in runs):
        for mode in dict.fromkeys(r.mode for r in runs):
            same = sorted((r for r in runs if (r.ahead, r.mode) == (ahead, mode)), key=lambda r: r.traj_per_s)
            table.setdefault(ahead, {})[mode] = same[(len(same) - 1) // 2]
    return table


def print_steady(runs: list[SteadyRun], curve: list[dict], header: str) -> dict[int, float]:
    """The table (median run of each k and mode), the engine curve, and async/bound per k."""
    print(header)
    print(
        f"{'k':>2} {'mode':7}{'traj/s':>8}{'gen tok/s':>11}{'forwards':>10}{'rows/fwd':>10}{'engine busy':>13}"
        f"{'rows/busy s':>13}{'prefill/row':>13}{'CPU ms/traj: engine env driver':>32}  every repeat's traj/s"
    )
    ratios = {}
    for ahead, modes in summarize(runs).items():
        for mode, run in modes.items():
            every = " ".join(f"{r.traj_per_s:.1f}" for r in runs if (r.ahead, r.mode) == (ahead, mode))
            print(
                f"{ahead:>2} {mode:7}{run.traj_per_s:8.1f}{run.generated_tokens / run.seconds:11.1f}"
                f"{run.forwards:10d}{run.rows_per_forward:10.1f}{run.busy:13.2f}{run.rows_per_busy_s:13.0f}"
                f"{run.prefill_tokens / max(run.requests, 1):13.1f}{_per_traj_ms(run):>32}  {every}"
            )
        ratios[ahead] = modes["async"].traj_per_s / modes["bound"].traj_per_s
    if curve:
        print("engine curve (zero-latency episodes, batch-synchronous): batch -> rows/call, rows/s")
        print("  " + "; ".join(f"{c['batch']}: {c['rows_per_call']:.0f}, {c['rows_per_s']:.0f}" for c in curve))
        for ahead, modes in summarize(runs).items():
            a, b = modes["async"], modes["bound"]
            predicted = rows_per_s_at(curve, a.rows_per_forward) / rows_per_s_at(curve, b.rows_per_forward)
            print(
                f"  k={ahead}: the curve at async's {a.rows_per_forward:.0f} and the bound's "
                f"{b.rows_per_forward:.0f} rows a forward predicts async/bound {predicted:.2f} (engine always busy)"
            )
    print("async/bound, steady state: " + ", ".join(f"k={k} {r:.2f}" for k, r in ratios.items()))
    return ratios


def _per_traj_ms(run: SteadyRun) -> str:
    return " ".join(
        f"{1000 * run.cpu_s[k] / run.trajectories:.1f}" for k in ("engine", "env", "driver") if k in run.cpu_s
    )


def write_record(path: str, args, load: tuple[float, ...], runs: list[SteadyRun], curve: list[dict]) -> None:
    """Every run, the curve, the arguments and the load at start, as JSON."""
    record = {
        "benchmark": "rollout_throughput.py --steady_batches",
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "load_at_start": list(load),
        "args": vars(args),
        "runs": [
            {**dataclasses.asdict(r), "traj_per_s": r.traj_per_s, "rows_per_busy_s": r.rows_per_busy_s} for r in runs
        ],
        "engine_curve": curve,
    }
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
