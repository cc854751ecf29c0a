"""VL FrozenLake rollouts on the `hf` engine: one request at a time vs batched vs batched + KV reuse.

What is measured: E episodes of the `vl_frozen_lake` example's train env (the tiny Qwen2.5-VL, the
example's sampling, 8 actions at most, one image a turn), played concurrently by E
`VLTrajEnvManager`s against one in-process `InferenceWorker`, as an env worker plays a step's
groups (4 episodes share a map). Three modes over the same episodes (env and sample seeds):
- one at a time: the worker takes one request per engine call (`max_batch_size=1`): each request
  prefilled and decoded alone, no KV reuse (what every VL request cost before
  `strategies/hf/vl_generate.py`);
- batched: each engine call takes every pending request (one prefill, one decode loop), no reuse;
- batched + reuse: as batched, and each episode's KV is kept between its turns (session = its
  traj id, released when it ends), so a turn prefills only its new ids and image.
The script checks that the three modes played the same trajectories (ids; log-probs to 1e-4).
Modes take turns over `--repeats` rounds; the table gives medians.

    python benchmarks/generation/vl_rollout.py [--episodes 32] [--repeats 3] [--threads 2]

The last line is machine-readable: `RESULT vl_rollout batched_speedup=<one at a time s / batched s>
reuse_speedup=<one at a time s / batched + reuse s> ...`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: import from this checkout
import envs  # noqa: F401  (registers the built-in envs)
from roll.agentic.env_manager.vl_traj_env_manager import VLTrajEnvManager
from roll.agentic.episode import EpisodeSpec
from roll.configs.loader import load_config
from roll.distributed.strategies.hf.kv_cache import DEFAULT_MAX_CACHED_TOKENS
from roll.distributed.workers.inference import InferenceWorker
from roll.models.loading import load_processor
from roll.pipeline.setup.rollout_builders import env_spec, sampling_params
from roll.pipeline.tiny_model import main as build_model

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "vl_frozen_lake"
MODES = {  # name -> (max_batch_size, max_cached_tokens)
    "one at a time": (1, 0),
    "batched": (256, 0),
    "batched + reuse": (256, DEFAULT_MAX_CACHED_TOKENS),
}


def setup(model_dir: str):
    """(config, the train tag's EnvSpec, processor, sampling params) of the example."""
    cfg = load_config(str(EXAMPLE), "agentic_val_vl_frozen_lake", [f"pretrain={model_dir}"])
    (tag,) = cfg.train_env_manager.tags
    processor = load_processor(model_dir)
    sampling = sampling_params(cfg.generating_args_for(cfg.train_env_manager), processor.tokenizer)
    return cfg, env_spec(cfg, tag, cfg.train_env_manager), processor, sampling


async def play(worker: InferenceWorker, setting, episodes: list[EpisodeSpec]) -> tuple[float, list]:
    """Play every episode concurrently; (wall s, trajectories in order)."""
    cfg, spec, processor, sampling = setting
    managers = [
        VLTrajEnvManager(
            spec,
            processor,
            worker.generate,
            sampling,
            cfg.sequence_length,
            max_images_per_prompt=spec.max_images_per_prompt,
        )
        for _ in episodes
    ]

    async def one(manager: VLTrajEnvManager, episode: EpisodeSpec):
        trajectory = await manager.run_episode(episode)
        worker.release_session(episode.traj_id)  # as the env worker does when the group ends
        manager.close()
        return trajectory

    start = time.perf_counter()
    trajectories = await asyncio.gather(*(one(m, e) for m, e in zip(managers, episodes)))
    return time.perf_counter() - start, trajectories


def run_mode(model_dir: str, mode: str, setting, episodes: list[EpisodeSpec], threads: int) -> dict:
    max_batch_size, max_cached_tokens = MODES[mode]
    worker = InferenceWorker(
        model_dir,
        num_threads=threads,
        max_batch_size=max_batch_size,
        max_cached_tokens=max_cached_tokens,
        continuous_batching=False,
    )

    async def warm_then_measure():  # one event loop: the worker's asyncio objects belong to it
        await play(worker, setting, episodes[:1])  # warm-up, not counted
        before = worker.get_stats()
        wall, trajectories = await play(worker, setting, episodes)
        return wall, trajectories, before, worker.get_stats()

    wall, trajectories, before, after = asyncio.run(warm_then_measure())
    counts = {k: after[k] - before[k] for k in ("engine_calls", "requests", "prefill_calls", "prefill_tokens")}
    return {"wall_s": wall, **counts, "trajectories": trajectories}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = build_model(["--preset", "vl_frozen_lake", "--output_dir", tempfile.mkdtemp() + "/vl"])
    setting = setup(model_dir)
    episodes = [
        EpisodeSpec(f"g{e // 4}", f"g{e // 4}-{e % 4}", env_seed=e // 4, sample_seed=e) for e in range(args.episodes)
    ]
    load_start = os.getloadavg()[0]
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for repeat in range(args.repeats):
        for mode in list(MODES) if repeat % 2 == 0 else list(MODES)[::-1]:  # take turns
            runs[mode].append(run_mode(model_dir, mode, setting, episodes, args.threads))
    load_end = os.getloadavg()[0]

    reference = runs["one at a time"][0]["trajectories"]
    same_ids = all(
        [t.token_ids for t in r["trajectories"]] == [t.token_ids for t in reference] for rs in runs.values() for r in rs
    )
    lp_diff = max(
        float(np.max(np.abs(np.array(t.infer_logprobs) - np.array(u.infer_logprobs))))
        for rs in runs.values()
        for r in rs
        for t, u in zip(r["trajectories"], reference)
    )
    med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "trajectories"} for m, rs in runs.items()}
    turns = sum(t.num_actions for t in reference)
    print(
        f"\n{args.episodes} VL FrozenLake episodes ({turns} turns, 1 image a turn), {args.threads} torch threads; "
        f"median of {args.repeats}; load {load_start:.1f} -> {load_end:.1f}"
    )
    print(f"{'mode':<18}{'wall s':>8}{'speedup':>9}{'engine calls':>14}{'prefills':>10}{'prefill ids':>13}")
    base = med["one at a time"]["wall_s"]
    for mode, m in med.items():
        print(
            f"{mode:<18}{m['wall_s']:>8.2f}{base / m['wall_s']:>8.2f}x{m['engine_calls']:>14.0f}"
            f"{m['prefill_calls']:>10.0f}{m['prefill_tokens']:>13.0f}"
        )
    print(f"same trajectories in every mode: {same_ids} (token ids), max |log-prob diff| {lp_diff:.1e}")
    print(
        f"\nRESULT vl_rollout batched_speedup={base / med['batched']['wall_s']:.2f} "
        f"reuse_speedup={base / med['batched + reuse']['wall_s']:.2f} "
        f"identical={int(same_ids and lp_diff < 1e-4)} episodes={args.episodes} load_start={load_start:.1f}"
    )


if __name__ == "__main__":
    main()
