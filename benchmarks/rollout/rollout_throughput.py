"""Rollout throughput: our env-level async rollout vs a batch-synchronous loop vs the zero-latency bound.

The same envs, model, trajectories and sampling, three ways, in turns within each repeat:
- async: the pipeline's own rollout of the trajectory-wise FrozenLake example (RolloutScheduler,
  EnvWorker actors, one InferenceWorker batching whatever is pending);
- sync: RAGEN's and verl's loop: a batch of `--concurrent_envs` envs steps together, then one
  batched `generate_many` for every live env, turn after turn;
- bound: async with no env latency.
Env latency is log-normal (`benchmarks/rollout/latency_env.py`, `--median_ms`, `--sigma`); the model is
the tiny random-init one, so most episodes run all `--max_turns` turns. A mode's time is the best
of `--repeats`; the engine runs `--engine_threads 1` torch thread (0: every core). The table also
prints what env latency alone costs each mode (Monte-Carlo). `--env_calls thread` steps the slow
env in the env workers' threads instead of awaiting its `astep` (the default).

    python benchmarks/rollout/rollout_throughput.py [--trajectories 256 --concurrent_envs 128 --group_size 8
        --max_turns 8 --median_ms 50 --sigma 1.0 --envs_per_worker 0 --engine_threads 1 --redundancy 0
        --repeats 3]

The last line is `RESULT async_over_sync=<x> async_over_bound=<y>` (ratios of trajectories/s).
`--steady_batches N [--ahead 0,1 --engine_sweep 32,64,128,256 --record FILE]`: async against the
bound in steady state instead (`benchmarks/rollout/rollout_steady.py`); `RESULT async_over_bound_k<k>=<y>`.
The method in full, and every run: benchmarks/results/rollout_throughput.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import heapq
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `benchmarks.*` must import here and in Ray workers
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))

import numpy as np
import ray

from benchmarks.common import load_line, result_line
from benchmarks.rollout import rollout_steady
from roll.agentic.env.registry import make_env
from roll.agentic.env_manager.chat import ChatFormatter
from roll.configs.loader import load_config
from roll.core.records import GenerateRequest
from roll.core.seeding import derive_seed
from roll.distributed.workers.inference import InferenceWorker
from roll.models.loading import load_tokenizer
from roll.models.tiny import build_tiny_model
from roll.pipeline.setup.builders import build_workers, init_ray
from roll.pipeline.setup.rollout_builders import build_rollout, sampling_params
from roll.pipeline.tiny_model import env_corpus

CONFIG_DIR = REPO / "examples" / "frozen_lake"
CONFIG_NAME = "agent_val_frozen_lake_traj"
# --env_calls: how the env manager waits on a slow step (awaited in its loop, or in a thread)
LATENCY_ENVS = {
    "await": "benchmarks.rollout.latency_env:SlowFrozenLakeEnv",
    "thread": "benchmarks.rollout.latency_env:ThreadedSlowFrozenLakeEnv",
}
TAG = "FrozenLake"


@dataclasses.dataclass
class Run:
    """One mode's best repeat: wall time, what it produced, and how the engine was called."""

    mode: str
    seconds: float
    trajectories: int
    generated_tokens: int
    env_steps: int
    engine_calls: int
    requests: int
    generate_s: float = float("nan")  # sync only: time in generate_many (the rest waits on envs)

    @property
    def traj_per_s(self) -> float:
        return self.trajectories / self.seconds


def bench_config(args, model_path: str, median_ms: float, output_dir: str, redundancy: int = 0):
    """The example config with this benchmark's sizes and the slow env, validated as usual. With
    `redundancy` r each group runs r extra envs, and fewer groups run at once so that the envs in
    flight stay at most `concurrent_envs`."""
    env = f"custom_envs.{TAG}"
    overrides = [
        f"pretrain={model_path}",
        f"output_dir={output_dir}",
        "eval_steps=0",
        "save_steps=0",
        f"rollout_batch_size={args.trajectories}",
        f"train_env_manager.group_size={args.group_size}",
        f"train_env_manager.num_env_groups={args.concurrent_envs // (args.group_size + redundancy)}",
        f"train_env_manager.group_size_redundancy={redundancy}",
        f"train_env_manager.max_env_num_per_worker={args.envs_per_worker}",
        f"actor_infer.strategy_args.strategy_config.max_batch_size={args.max_batch_size}",
        f"+actor_infer.strategy_args.strategy_config.batch_wait_ms={args.batch_wait_ms}",
        f"{env}.env_type='{LATENCY_ENVS[args.env_calls]}'",
        f"{env}.max_steps={args.max_turns}",
        f"{env}.env_config.median_ms={median_ms}",
        f"{env}.env_config.sigma={args.sigma}",
    ]
    return load_config(str(CONFIG_DIR), CONFIG_NAME, overrides)


def build_inference(cfg, engine_threads: int) -> dict:
    """The pipeline's workers (`build_workers`: the inference worker takes every core) when
    `engine_threads` is 0, else only the inference worker, made the builder's way with that many
    torch threads. Returned as a dict the caller keeps: Ray cancels actors nobody holds."""
    if engine_threads == 0:
        return build_workers(cfg)
    infer = cfg.actor_infer
    return {
        "inference": [
            ray.remote(InferenceWorker)
            .options(num_cpus=0)
            .remote(
                infer.model_args.model_name_or_path,
                dtype=infer.model_args.dtype,
                num_threads=engine_threads,
                max_batch_size=int(infer.strategy_args.strategy_config["max_batch_size"]),
                batch_wait_ms=float(infer.strategy_args.strategy_config.get("batch_wait_ms", 0.0)),
            )
        ]
    }


def engine_counts(inference) -> tuple[int, int]:
    stats = ray.get(inference.get_stats.remote())
    return stats["engine_calls"], stats["requests"]


def run_async(mode: str, scheduler, inference, step: int, num_groups: int) -> Run:
    """One `collect` of the pipeline's rollout, exactly as a training step makes it."""
    calls, requests = engine_counts(inference)
    start = time.perf_counter()
    trajs, dropped = scheduler.collect(step, num_groups)
    seconds = time.perf_counter() - start
    if dropped:
        raise RuntimeError(f"{mode}: {len(dropped)} trajectories dropped, e.g. {dropped[0]}")
    calls_after, requests_after = engine_counts(inference)
    return Run(
        mode,
        seconds,
        len(trajs),
        sum(t.num_generated_tokens for t in trajs),
        sum(t.num_actions for t in trajs),
        calls_after - calls,
        requests_after - requests,
    )


class SyncRollout:
    """The batch-synchronous baseline: `concurrent_envs` envs step together, then one generate.

    Token bookkeeping is the trajectory-wise manager's (prompt ids + generated ids + the ids of
    the next turn, KV reused per conversation), so the engine does the same work per request; the
    only difference is who waits for whom.
    """

    def __init__(self, cfg, tokenizer, inference, concurrent_envs: int):
        self.spec = cfg.custom_envs[TAG]
        self.envs = [make_env(self.spec.env_type, dict(self.spec.env_config)) for _ in range(concurrent_envs)]
        self.pool = ThreadPoolExecutor(concurrent_envs)  # every env of a turn steps at once
        self.chat = ChatFormatter(tokenizer, self.spec.response_prefix)
        self.inference = inference
        sampling = sampling_params(cfg.generating_args_for(cfg.train_env_manager), tokenizer)
        self.sampling = dataclasses.replace(sampling, max_new_tokens=self.spec.max_tokens_per_step)
        self.budget = cfg.sequence_length - self.spec.max_tokens_per_step
        self.group_size = cfg.train_env_manager.group_size

    def collect(self, scheduler, step: int, num_groups: int) -> Run:
        """The same groups as `scheduler.collect(step, num_groups)`, a batch of envs at a time."""
        episodes = [
            scheduler.group_spec(step, j, False).episode(m) for j in range(num_groups) for m in range(self.group_size)
        ]
        calls, requests = engine_counts(self.inference)
        tokens = env_steps = 0
        self.generate_s = 0.0
        start = time.perf_counter()
        for first in range(0, len(episodes), len(self.envs)):
            batch_tokens, batch_steps = self._play_batch(episodes[first : first + len(self.envs)])
            tokens, env_steps = tokens + batch_tokens, env_steps + batch_steps
        seconds = time.perf_counter() - start
        calls_after, requests_after = engine_counts(self.inference)
        return Run(
            "sync",
            seconds,
            len(episodes),
            tokens,
            env_steps,
            calls_after - calls,
            requests_after - requests,
            self.generate_s,
        )

    def _play_batch(self, episodes) -> tuple[int, int]:
        """Play one batch of episodes turn by turn; (generated tokens, env steps)."""
        envs = self.envs[: len(episodes)]
        resets = list(self.pool.map(lambda env, ep: env.reset(seed=ep.env_seed), envs, episodes))
        prompts = [self.chat.initial_prompt(self._instruction(info), obs) for obs, info in resets]
        live, tokens, env_steps = list(range(len(episodes))), 0, 0
        for turn in range(self.spec.max_steps):
            live = [i for i in live if len(prompts[i]) <= self.budget]
            if not live:
                break
            requests = [
                GenerateRequest(
                    f"{episodes[i].traj_id}/{turn}",
                    prompts[i],
                    self.sampling,
                    derive_seed(episodes[i].sample_seed, turn),
                    session_id=episodes[i].traj_id,
                )
                for i in live
            ]
            start = time.perf_counter()
            outs = ray.get(self.inference.generate_many.remote(requests))
            self.generate_s += time.perf_counter() - start
            texts = [self.chat.response_text(out.token_ids) for out in outs]
            results = list(self.pool.map(lambda i, text: envs[i].step(text), live, texts))
            still = []
            for i, out, (obs, _, terminated, truncated, _) in zip(live, outs, results):
                tokens, env_steps = tokens + len(out.token_ids), env_steps + 1
                if not (terminated or truncated) and turn + 1 < self.spec.max_steps:
                    prompts[i] = prompts[i] + out.token_ids + self.chat.next_turn(obs, out.token_ids)
                    still.append(i)
            live = still
        ray.get([self.inference.release_session.remote(ep.traj_id) for ep in episodes])
        return tokens, env_steps

    def _instruction(self, info: dict) -> str | None:
        return info.get("env_instruction") if self.spec.instruction is None else self.spec.instruction


def env_only_seconds(args, samples: int = 200) -> tuple[float, float]:
    """Wall seconds that env latency alone would take (an infinitely fast engine), Monte-Carlo
    over the latency distribution, every episode `max_turns` turns long: (async, sync).

    Async: a group lasts as long as its slowest member's summed latencies, and the scheduler
    gives each next group to the first slot that frees up. Sync: each turn of each batch lasts
    as long as its slowest env.
    """
    rng = np.random.default_rng(0)
    slots, groups = args.concurrent_envs // args.group_size, args.trajectories // args.group_size
    batches = [
        min(args.concurrent_envs, args.trajectories - first)
        for first in range(0, args.trajectories, args.concurrent_envs)
    ]

    def latency(*shape: int) -> np.ndarray:
        return args.median_ms / 1000 * np.exp(args.sigma * rng.standard_normal(shape))

    async_s, sync_s = [], []
    for _ in range(samples):
        free_at = [0.0] * slots
        for group_s in latency(groups, args.group_size, args.max_turns).sum(-1).max(-1):
            heapq.heappush(free_at, heapq.heappop(free_at) + group_s)
        async_s.append(max(free_at))
        sync_s.append(sum(latency(args.max_turns, n).max(-1).sum() for n in batches))
    return float(np.mean(async_s)), float(np.mean(sync_s))


def print_table(runs: dict[str, list[Run]], args, load: tuple[float, float, float]) -> dict[str, Run]:
    """The best repeat of each mode, every repeat's wall time next to it; returns the best."""
    print(
        f"{args.trajectories} trajectories (groups of {args.group_size}), <= {args.max_turns} turns, "
        f"{args.concurrent_envs} envs in flight, env.step log-normal median {args.median_ms:g} ms "
        f"sigma {args.sigma:g}; best of {args.repeats}; engine threads {args.engine_threads or os.cpu_count()}, "
        f"{load_line(load=load)}"
    )
    print(
        f"{'mode':8}{'wall s':>9}{'traj/s':>9}{'gen tok/s':>11}{'steps/s':>9}{'engine calls':>14}"
        f"{'req/call':>10}  every repeat's wall s"
    )
    best = {mode: min(mode_runs, key=lambda r: r.seconds) for mode, mode_runs in runs.items()}
    for mode, run in best.items():
        every = " ".join(f"{r.seconds:.2f}" for r in runs[mode])
        print(
            f"{mode:8}{run.seconds:9.2f}{run.traj_per_s:9.1f}{run.generated_tokens / run.seconds:11.1f}"
            f"{run.env_steps / run.seconds:9.1f}{run.engine_calls:14d}{run.requests / max(run.engine_calls, 1):10.1f}"
            f"  {every}"
        )
    a, s, b = best["async"], best["sync"], best["bound"]
    print(
        f"sync split: {s.generate_s:.2f} s in generate_many, {s.seconds - s.generate_s:.2f} s stepping envs "
        "(each turn as long as its slowest env)"
    )
    env_async, env_sync = env_only_seconds(args)
    print(
        f"env latency alone (Monte-Carlo, no engine time): async critical path {env_async:.2f} s "
        f"(bound's whole run: {b.seconds:.2f} s), sync {env_sync:.2f} s"
    )
    print(
        f"async/sync : {a.traj_per_s / s.traj_per_s:.2f}x trajectories/s, "
        f"{(a.generated_tokens / a.seconds) / (s.generated_tokens / s.seconds):.2f}x tokens/s   (target >= 2)"
    )
    print(
        f"async/bound: {a.traj_per_s / b.traj_per_s:.2f}x trajectories/s, "
        f"{(a.generated_tokens / a.seconds) / (b.generated_tokens / b.seconds):.2f}x tokens/s   (target >= 0.9)"
    )
    return best


def measure(args, schedulers: dict, sync: SyncRollout, inference) -> dict[str, list[Run]]:
    """Every mode once per repeat, on that repeat's groups; the order rotates between repeats so
    that no mode always runs right after another."""
    num_groups = args.trajectories // args.group_size
    warm = min(num_groups, 4)  # actor start-up, first calls: untimed
    for scheduler in schedulers.values():
        scheduler.collect(0, warm)
    sync.collect(schedulers["async"], 0, warm)
    play = {
        "async": lambda step: run_async("async", schedulers["async"], inference, step, num_groups),
        "sync": lambda step: sync.collect(schedulers["async"], step, num_groups),
        "bound": lambda step: run_async("bound", schedulers["bound"], inference, step, num_groups),
    }
    runs: dict[str, list[Run]] = {mode: [] for mode in play}
    order = list(play)
    for step in range(1, args.repeats + 1):
        for mode in order:
            runs[mode].append(play[mode](step))
        print(f"repeat {step}: " + ", ".join(f"{m} {runs[m][-1].seconds:.2f} s" for m in order), flush=True)
        order = order[1:] + order[:1]
    return runs


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trajectories", type=int, default=256, help="trajectories per mode and repeat")
    parser.add_argument("--concurrent_envs", type=int, default=128, help="envs in flight (sync: batch size)")
    parser.add_argument("--group_size", type=int, default=8)
    parser.add_argument("--max_turns", type=int, default=8, help="custom_envs.FrozenLake.max_steps")
    parser.add_argument("--median_ms", type=float, default=50.0)
    parser.add_argument("--sigma", type=float, default=1.0, help="log-normal shape: the tail")
    parser.add_argument(
        "--envs_per_worker", type=int, default=0, help="train_env_manager.max_env_num_per_worker (0: one env worker)"
    )
    parser.add_argument("--max_batch_size", type=int, default=256, help="engine rows per call")
    parser.add_argument(
        "--env_calls",
        choices=sorted(LATENCY_ENVS),
        default="await",
        help="the slow env's steps: awaited in the env worker's loop (astep) or run in its threads",
    )
    parser.add_argument(
        "--batch_wait_ms", type=float, default=0.0, help="actor_infer's batch_wait_ms: a request waits for company"
    )
    parser.add_argument(
        "--engine_threads",
        type=int,
        default=1,
        help="torch threads of the inference worker; 0: the pipeline's (every core)",
    )
    parser.add_argument(
        "--redundancy",
        type=int,
        default=0,
        help="async only: train_env_manager.group_size_redundancy (extra envs per group)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steady_batches", type=int, default=0, help="N > 1: the steady-state mode, N batches a run")
    parser.add_argument("--ahead", type=_ints, default=[1], help="steady: async_generation_ratio values, e.g. 0,1")
    parser.add_argument("--engine_sweep", type=_ints, default=[], help="steady: batch sizes of the engine curve")
    parser.add_argument("--record", default=None, help="steady: write every run as JSON to this file")
    args = parser.parse_args()
    if args.steady_batches == 1 or args.steady_batches < 0:
        parser.error("--steady_batches must be 0 (off) or at least 2: batch 1 is not timed")
    if args.trajectories % args.group_size or args.concurrent_envs % args.group_size:
        parser.error("--trajectories and --concurrent_envs must be multiples of --group_size")
    return args


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


@contextlib.contextmanager
def rollouts(args):
    """The tiny model, the slow and the zero-latency config, Ray, one inference worker and a
    scheduler for each config ("async", "bound"): (slow, fast, tokenizer, inference, schedulers)."""
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "tiny", corpus=env_corpus("frozen_lake", {}))
        slow = bench_config(args, model, args.median_ms, tmp, args.redundancy)
        fast = bench_config(args, model, 0.0, tmp)
        init_ray(None)
        try:
            tokenizer = load_tokenizer(model)
            workers = build_inference(slow, args.engine_threads)
            inference = workers["inference"][0]
            schedulers = {
                "async": build_rollout(slow, slow.train_env_manager, inference, tokenizer, "train"),
                "bound": build_rollout(fast, fast.train_env_manager, inference, tokenizer, "train"),
            }
            yield slow, fast, tokenizer, inference, schedulers
        finally:
            ray.shutdown()


def main_steady(args, load: tuple[float, float, float]) -> None:
    """`--steady_batches`: async and the bound in steady state, side by side (rollout_steady.py)."""
    with rollouts(args) as (_, fast, tokenizer, inference, schedulers):
        runs = rollout_steady.measure_steady(args, schedulers, inference)
        sizes = args.engine_sweep
        sync = SyncRollout(fast, tokenizer, inference, max(sizes)) if sizes else None
        curve = rollout_steady.engine_curve(sync, schedulers["bound"], sizes) if sync else []
    header = (
        f"steady state: {args.steady_batches} batches of {args.trajectories} trajectories a run (batches 2.. timed), "
        f"groups of {args.group_size}, {args.concurrent_envs} envs, redundancy {args.redundancy}, <= {args.max_turns} "
        f"turns, env.step median {args.median_ms:g} ms sigma {args.sigma:g}; median of {args.repeats}; engine threads "
        f"{args.engine_threads or os.cpu_count()}, batch wait {args.batch_wait_ms:g} ms, env steps {args.env_calls}ed, "
        f"{load_line(load=load)}"
    )
    ratios = rollout_steady.print_steady(runs, curve, header)
    if args.record:
        rollout_steady.write_record(args.record, args, load, runs, curve)
    print(result_line("", {f"async_over_bound_k{k}": r for k, r in ratios.items()}))


def main() -> None:
    args = parse_args()
    load = os.getloadavg()
    if args.steady_batches:
        return main_steady(args, load)
    with rollouts(args) as (slow, _, tokenizer, inference, schedulers):
        runs = measure(args, schedulers, SyncRollout(slow, tokenizer, inference, args.concurrent_envs), inference)
    best = print_table(runs, args, load)
    a, s, b = (best[m].traj_per_s for m in ("async", "sync", "bound"))
    print(result_line("", {"async_over_sync": a / s, "async_over_bound": a / b}))


if __name__ == "__main__":
    main()
