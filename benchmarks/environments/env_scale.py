"""Many envs at once: memory per env and steps/s, for 1 to 1024 concurrent FrozenLake / Sokoban / WebShop envs.

For each env (the example configs' settings) and each count N: the memory N built and reset envs
hold (tracemalloc, and how much of it is gymnasium spaces), and steps/s three ways, in turns
within each repeat: a plain loop, every call forced onto EnvWorker's thread path (`threads`), and
EnvWorker's path as the env declares it (`worker`: cheap calls run inline, `TextEnv.cheap_calls`).
Actions are seeded random action words; WebShop plays its scripted shopper. An env whose episode
ended is reset, and the reset counts. The table gives median steps/s and, last, the worker/loop
ratio per second of process CPU time (steadier on a shared machine).

`--protocol roll` measures instead as ROLL's envs were measured (`roll_protocol.py`).

    python benchmarks/environments/env_scale.py [--counts 1 64 256 1024 --envs frozen_lake sokoban webshop
        --min_steps 4096]
    python benchmarks/environments/env_scale.py --protocol roll

The last line, `RESULT env_scale ...`, gives FrozenLake's smallest worker/loop ratio over the
counts (wall clock and CPU time) and its largest memory per env. The method in full, and every
run: benchmarks/results/env_scale.md.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: import from this checkout
from benchmarks.common import Clock, load_line
from roll.agentic.env.registry import make_env
from roll.agentic.env_manager.env_calls import EnvCaller

# the env_config of examples/frozen_lake, examples/sokoban and examples/webshop
ENV_CONFIGS = {
    "frozen_lake": {"size": 4, "hole_prob": 0.2, "is_slippery": False, "max_path_length": 8},
    "sokoban": {"dim_room": [6, 6], "num_boxes": 1, "search_depth": 10},
    "webshop": {"max_steps": 8, "results_per_page": 5},
}
EXECUTOR_CAP = 64  # EnvWorker's thread pool: min(envs, 64)
STEP_TIMEOUT_S = 60.0  # EnvWorker's default step timeout


def build_envs(env_type: str, count: int) -> list:
    envs = [make_env(env_type, ENV_CONFIGS[env_type]) for _ in range(count)]
    for seed, env in enumerate(envs):
        env.reset(seed=seed)
    return envs


def memory_per_env(env_type: str, count: int) -> tuple[float, float]:
    """(bytes / env, bytes / env held by gymnasium spaces) of `count` built and reset envs."""
    gc.collect()
    tracemalloc.start()
    envs = build_envs(env_type, count)
    snapshot = tracemalloc.take_snapshot()
    tracemalloc.stop()
    del envs
    stats = snapshot.statistics("filename")
    total = sum(s.size for s in stats)
    spaces = sum(s.size for s in stats if f"gymnasium{os.sep}spaces" in s.traceback[0].filename)
    return total / count, spaces / count


def action_texts(env, count: int, seed: int) -> list[str | None]:
    """`count` random action words in the answer format; None each for an env without action
    words (its step then plays `env.scripted_action()`)."""
    if not env.actions:
        return [None] * count
    rng = np.random.default_rng(seed)
    return [f"<answer>{env.actions[i]}</answer>" for i in rng.integers(len(env.actions), size=count)]


def _act(env, text: str | None) -> str:
    return env.scripted_action() if text is None else text


def plain_loop(envs: list, rounds: int) -> tuple[float, float]:
    """Steps/s (wall, CPU) stepping every env in turn, `rounds` times."""
    texts = action_texts(envs[0], rounds * len(envs), seed=0)
    next_seed = len(envs)
    with Clock() as clock:
        for r in range(rounds):
            for i, env in enumerate(envs):
                _, _, terminated, truncated, _ = env.step(_act(env, texts[r * len(envs) + i]))
                if terminated or truncated:
                    env.reset(seed=next_seed)
                    next_seed += 1
    return clock.rates(rounds * len(envs))


async def _worker_episode(caller: EnvCaller, texts: list[str], seed: int) -> None:
    for text in texts:
        _, _, terminated, truncated, _ = await caller("step", _act(caller.env, text))
        if terminated or truncated:
            await caller("reset", seed=seed)
            seed += 1_000_003  # a new map for this env's next episode, distinct from the others


async def _worker(envs: list, rounds: int, inline: bool) -> tuple[float, float]:
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(min(len(envs), EXECUTOR_CAP)))
    callers = [EnvCaller(env, timeout_s=STEP_TIMEOUT_S) for env in envs]
    if not inline:
        for caller in callers:
            caller.inline.clear()
    texts = action_texts(envs[0], rounds * len(envs), seed=0)
    with Clock() as clock:
        await asyncio.gather(*(_worker_episode(c, texts[i :: len(envs)], len(envs) + i) for i, c in enumerate(callers)))
    return clock.rates(rounds * len(envs))


def worker_loop(envs: list, rounds: int, inline: bool = True) -> tuple[float, float]:
    """Steps/s (wall, CPU) with one coroutine per env calling it through `EnvCaller` (EnvWorker's path);
    `inline=False` forces every call onto the thread path."""
    return asyncio.run(_worker(envs, rounds, inline))


def speed_cell(env_type: str, count: int, rounds: int, repeats: int) -> dict[str, float]:
    """Median steps/s (per wall-clock and per CPU second) of the plain loop, the forced thread
    path and the worker path, measured in turn `repeats` times, so that all three see the same
    load on a shared machine."""
    runs = []
    for _ in range(repeats):
        loop = plain_loop(build_envs(env_type, count), rounds)
        threads = worker_loop(build_envs(env_type, count), rounds, inline=False)
        worker = worker_loop(build_envs(env_type, count), rounds)
        runs.append(
            {
                "loop": loop[0],
                "threads": threads[0],
                "worker": worker[0],
                "loop_cpu": loop[1],
                "threads_cpu": threads[1],
                "worker_cpu": worker[1],
            }
        )
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 64, 256, 1024])
    parser.add_argument("--envs", nargs="+", choices=sorted(ENV_CONFIGS), default=list(ENV_CONFIGS))
    parser.add_argument("--min_steps", type=int, default=4096, help="steps per cell, at least 4 per env")
    parser.add_argument("--repeats", type=int, default=3, help="median of this many interleaved runs per cell")
    parser.add_argument(
        "--protocol",
        choices=["scale", "roll"],
        default="scale",
        help="roll: resets/s and steps/s as measured for ROLL's envs (roll_protocol.py)",
    )
    args = parser.parse_args()
    print(load_line())
    if args.protocol == "roll":
        from benchmarks.environments.roll_protocol import main as roll_main

        roll_main()
        return
    # lazy imports, module-level caches and WebShop's server, outside the measurements
    warm = [build_envs(env_type, 1) for env_type in args.envs]  # noqa: F841 (kept alive on purpose)
    print(
        f"{'env':12}{'envs':>6}{'KB/env':>8}{'spaces KB':>10}{'steps/s loop':>14}{'threads':>9}{'worker':>9}"
        f"{'threads/loop':>14}{'worker/loop':>13}{'(per CPU s)':>13}"
    )
    frozen_ratios, frozen_cpu_ratios, frozen_kb = [], [], []
    for env_type in args.envs:
        for count in args.counts:
            held, spaces = memory_per_env(env_type, count)
            got = speed_cell(env_type, count, max(4, args.min_steps // count), args.repeats)
            ratio, cpu_ratio = got["worker"] / got["loop"], got["worker_cpu"] / got["loop_cpu"]
            print(
                f"{env_type:12}{count:6d}{held / 1024:8.1f}{spaces / 1024:10.1f}{got['loop']:14.0f}"
                f"{got['threads']:9.0f}{got['worker']:9.0f}{got['threads'] / got['loop']:13.2f}x"
                f"{ratio:12.2f}x{cpu_ratio:12.2f}x",
                flush=True,
            )
            if env_type == "frozen_lake":
                frozen_ratios.append(ratio)
                frozen_cpu_ratios.append(cpu_ratio)
                frozen_kb.append(held / 1024)
    if frozen_ratios:
        print(
            f"RESULT env_scale frozen_lake_worker_over_loop_min={min(frozen_ratios):.2f} "
            f"frozen_lake_worker_over_loop_cpu_min={min(frozen_cpu_ratios):.2f} "
            f"frozen_lake_kb_per_env_max={max(frozen_kb):.1f}"
        )


if __name__ == "__main__":
    main()
