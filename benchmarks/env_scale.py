"""Many envs at once: memory per env and steps/s, for 1 to 1024 concurrent FrozenLake / Sokoban / WebShop envs.

For each env (the example configs' settings) and each count N:
- memory per env: what N built and reset envs hold, by tracemalloc (Python objects and numpy
  arrays), after one untimed env of each kind has paid for lazy imports and caches; and how much
  of it is the gymnasium `spaces.Text` observation and action spaces every `TextEnv` builds
  (each indexes its whole character set). RSS growth is not reported: in one process it mostly
  reads memory that earlier cells freed, so it says little per env;
- steps/s through a plain loop: every env steps in turn, one process, one thread;
- steps/s the env-worker way: one coroutine per env awaiting
  `asyncio.wait_for(asyncio.to_thread(env.step, text), 60)` on a pool of min(N, 64) threads,
  the path of `BaseEnvManager._env_call` inside `EnvWorker` (same executor size); what a step
  costs in thread hand-offs when the env itself is fast.
Actions are random action words in the answer format (`<answer>Left</answer>`) from a seeded
generator; WebShop, whose actions are open text, plays its scripted shopper (search, open the
goal product, pick its options, buy: every step an HTTP request to the process's shop server on
127.0.0.1, which one env kept alive for the whole run holds up, so no cell pays for starting it).
An env whose episode ended is reset (seeded) and the reset counts in the loop time.
Each cell steps every env `max(4, --min_steps // N)` times.

    python benchmarks/env_scale.py [--counts 1 64 256 1024 --envs frozen_lake sokoban webshop --min_steps 4096]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from roll.agentic.env.registry import make_env

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


def plain_loop(envs: list, rounds: int) -> float:
    """Steps/s stepping every env in turn, `rounds` times."""
    texts = action_texts(envs[0], rounds * len(envs), seed=0)
    next_seed = len(envs)
    start = time.perf_counter()
    for r in range(rounds):
        for i, env in enumerate(envs):
            _, _, terminated, truncated, _ = env.step(_act(env, texts[r * len(envs) + i]))
            if terminated or truncated:
                env.reset(seed=next_seed)
                next_seed += 1
    return rounds * len(envs) / (time.perf_counter() - start)


async def _threaded_episode(env, texts: list[str], seed: int) -> None:
    for text in texts:
        step = asyncio.to_thread(lambda: env.step(_act(env, text)))
        _, _, terminated, truncated, _ = await asyncio.wait_for(step, STEP_TIMEOUT_S)
        if terminated or truncated:
            await asyncio.wait_for(asyncio.to_thread(env.reset, seed=seed), STEP_TIMEOUT_S)
            seed += 1_000_003  # a new map for this env's next episode, distinct from the others


async def _threaded(envs: list, rounds: int) -> float:
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(min(len(envs), EXECUTOR_CAP)))
    texts = action_texts(envs[0], rounds * len(envs), seed=0)
    start = time.perf_counter()
    await asyncio.gather(*(_threaded_episode(env, texts[i::len(envs)], len(envs) + i) for i, env in enumerate(envs)))
    return rounds * len(envs) / (time.perf_counter() - start)


def threaded_loop(envs: list, rounds: int) -> float:
    """Steps/s with one coroutine per env and the steps in a thread pool (EnvWorker's path)."""
    return asyncio.run(_threaded(envs, rounds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 64, 256, 1024])
    parser.add_argument("--envs", nargs="+", choices=sorted(ENV_CONFIGS), default=list(ENV_CONFIGS))
    parser.add_argument("--min_steps", type=int, default=4096, help="steps per cell, at least 4 per env")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"{os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at start")
    # lazy imports, module-level caches and WebShop's server, outside the measurements
    warm = [build_envs(env_type, 1) for env_type in args.envs]  # noqa: F841 (kept alive on purpose)
    print(f"{'env':12}{'envs':>6}{'KB/env':>8}{'of which spaces':>17}{'steps/s loop':>14}"
          f"{'steps/s threads':>17}{'threads/loop':>14}")
    for env_type in args.envs:
        for count in args.counts:
            held, spaces = memory_per_env(env_type, count)
            rounds = max(4, args.min_steps // count)
            loop = plain_loop(build_envs(env_type, count), rounds)
            threads = threaded_loop(build_envs(env_type, count), rounds)
            print(f"{env_type:12}{count:6d}{held / 1024:8.1f}{spaces / 1024:17.1f}{loop:14.0f}"
                  f"{threads:17.0f}{threads / loop:13.2f}x", flush=True)


if __name__ == "__main__":
    main()
