"""ROLL's env protocol (`env_scale.py --protocol roll`): our envs measured the way issue 21
measured ROLL's, and printed beside ROLL's figures.

- resets/s: `reset(seed=s)` for the 200 seeds 0..199;
- steps/s: after `reset(seed=0)`, 2,000 `step("<answer>W</answer>")` with W cycling Left, Down,
  Right, Up (each step returns the text observation); an episode that ends is reset with the
  next seed, and the reset counts in the time;
- the median of 3 repeats, for FrozenLake 4x4 non-slippery and SimpleSokoban 6x6 with 1 box,
  with the env_config of ROLL's example library (`custom_env.FrozenLake` / `.SimpleSokoban` of
  ROLL's `traj_envs.yaml`: its `<answer>(.*?)</answer>` action pattern, 10 actions per episode,
  its format penalties).

Each env is measured on two paths, interleaved in every repeat so that both see the same load:
`plain` calls the env directly (what the ROLL figures are), `worker` calls it the way an env
manager does inside EnvWorker (`EnvCaller`: inline where the env declares the call cheap, else a
thread hand-off bounded by the 60 s step timeout). ROLL's figures are the issue's, measured on a
2-core machine; ROLL's envs themselves are not installed here. On a shared machine the wall
clock counts the time other jobs held the cores, so the worker path is also given per second of
this process's CPU time, what the envs would reach with a core to themselves.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: import from this checkout
from benchmarks.common import Clock
from roll.agentic.env.registry import make_env
from roll.agentic.env_manager.env_calls import EnvCaller

SEEDS = 200
ACTIONS = 2000
REPEATS = 3
CYCLE = ("Left", "Down", "Right", "Up")
ACTION_PATTERN = "<answer>(.*?)</answer>"
# name: (env_type, env_config, ROLL's resets/s, ROLL's steps/s)
ENVS = {
    "FrozenLake": (
        "frozen_lake",
        {"size": 4, "is_slippery": False, "max_steps": 10, "format_penalty": -0.01, "action_pattern": ACTION_PATTERN},
        2440,
        30142,
    ),
    "SimpleSokoban": (
        "sokoban",
        {
            "dim_room": [6, 6],
            "num_boxes": 1,
            "max_steps": 10,
            "format_penalty": -0.15,
            "action_pattern": ACTION_PATTERN,
        },
        547,
        353,
    ),
}
TEXTS = [f"<answer>{CYCLE[i % len(CYCLE)]}</answer>" for i in range(ACTIONS)]


def plain_resets(env) -> tuple[float, float]:
    with Clock() as clock:
        for seed in range(SEEDS):
            env.reset(seed=seed)
    return clock.rates(SEEDS)


def plain_steps(env) -> tuple[float, float]:
    env.reset(seed=0)
    seed = 0
    with Clock() as clock:
        for text in TEXTS:
            _, _, terminated, truncated, _ = env.step(text)
            if terminated or truncated:
                seed += 1
                env.reset(seed=seed)
    return clock.rates(ACTIONS)


async def _worker_resets(call: EnvCaller) -> tuple[float, float]:
    with Clock() as clock:
        for seed in range(SEEDS):
            await call("reset", seed=seed)
    return clock.rates(SEEDS)


async def _worker_steps(call: EnvCaller) -> tuple[float, float]:
    await call("reset", seed=0)
    seed = 0
    with Clock() as clock:
        for text in TEXTS:
            _, _, terminated, truncated, _ = await call("step", text)
            if terminated or truncated:
                seed += 1
                await call("reset", seed=seed)
    return clock.rates(ACTIONS)


def worker(measure, env) -> tuple[float, float]:
    """`measure` (a `_worker_*`) through an `EnvCaller` in a fresh event loop with EnvWorker's
    executor for one env."""

    async def run():
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(1))
        return await measure(EnvCaller(env, timeout_s=60.0))

    return asyncio.run(run())


def measure(env_type: str, env_config: dict) -> dict[str, float]:
    """Median over `REPEATS` of resets/s and steps/s on both paths, interleaved, per wall-clock
    second and (keys ending in `_cpu`) per second of process CPU time."""
    env = make_env(env_type, env_config)
    plain_steps(env)  # warm: lazy imports, caches
    runs: dict[str, list[float]] = {}
    for _ in range(REPEATS):
        for key, (wall, cpu) in (
            ("plain_resets", plain_resets(env)),
            ("worker_resets", worker(_worker_resets, env)),
            ("plain_steps", plain_steps(env)),
            ("worker_steps", worker(_worker_steps, env)),
        ):
            runs.setdefault(key, []).append(wall)
            runs.setdefault(key + "_cpu", []).append(cpu)
    return {key: statistics.median(values) for key, values in runs.items()}


def main() -> None:
    print(
        f"ROLL's protocol: resets/s over {SEEDS} seeds, steps/s over {ACTIONS} actions cycling "
        f"{'/'.join(CYCLE)}, median of {REPEATS}; ROLL's figures from issue 21 (2-core machine)"
    )
    print(
        f"{'env':15}{'':8}{'ours plain':>12}{'ours worker':>13}{'ROLL':>9}{'plain/ROLL':>12}{'worker/ROLL':>13}"
        f"{'worker/plain':>14}{'worker per CPU s':>18}{'/ROLL':>7}"
    )
    result = []
    for name, (env_type, env_config, roll_resets, roll_steps) in ENVS.items():
        got = measure(env_type, env_config)
        for what, roll in (("resets", roll_resets), ("steps", roll_steps)):
            plain, work = got[f"plain_{what}"], got[f"worker_{what}"]
            work_cpu = got[f"worker_{what}_cpu"]
            print(
                f"{name:15}{what + '/s':8}{plain:12.0f}{work:13.0f}{roll:9d}{plain / roll:11.1f}x"
                f"{work / roll:12.1f}x{work / plain:13.2f}x{work_cpu:18.0f}{work_cpu / roll:6.1f}x",
                flush=True,
            )
            result += [
                f"{name}_{what}_worker={work:.0f}",
                f"{name}_{what}_worker_over_roll={work / roll:.1f}",
                f"{name}_{what}_worker_cpu_over_roll={work_cpu / roll:.1f}",
            ]
    print("RESULT env_scale_roll " + " ".join(result))
