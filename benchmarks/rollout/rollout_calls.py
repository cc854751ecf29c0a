"""Rollout engine calls: an env worker's generate requests batched into one Ray call per tick vs
one Ray call per request, on the README's FrozenLake example (step-wise, 256 envs, 1 token an action).

The same groups (step r's 32 groups of 8, seeds from `RolloutScheduler.group_spec`) are played by
three env workers of the product class (`EnvWorker`, every slot in one worker as
`max_env_num_per_worker: 0` gives), each run in this process against one `InferenceWorker` actor:
- batched: the env worker's own route (`roll.agentic.rollout.batching_client.BatchingClient`: the
  requests its managers make within 2 ms of each other, or while its call is in flight, go in one
  `generate_many` call; on main since the env workers batch);
- per_request: the same env worker whose gateway sends each request in its own
  `InferenceWorker.generate` Ray call (the route a per-request design would take);
- env_only: the same env worker against an in-process engine that answers every request at once
  with one fixed token (no Ray, no model): what the env worker's own Python costs a step.
The modes take turns within each repeat (the order rotates), so load from other processes hits
all of them; a mode's figure is its median over the repeats. The batched and per_request modes
send the same requests to the same weights, and `same ids` says whether their sampled tokens
match: each request samples with its own seed, so its tokens do not depend on its batch-mates.

    python benchmarks/rollout/rollout_calls.py [--repeats 5 --engine_threads 1]

The last line is `RESULT calls_ratio=<per_request calls / batched calls>
rollout_ratio=<per_request s / batched s> env_only_share=<env_only s / batched s>`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import ray

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: import from this checkout
from benchmarks.common import REPO, result_line
from roll.agentic.gateway import InferenceGateway
from roll.agentic.rollout.env_worker import EnvWorker
from roll.agentic.rollout.scheduler import RolloutScheduler
from roll.configs.loader import load_config
from roll.core.records import GenerateOutput
from roll.distributed.workers.inference import InferenceWorker
from roll.models.loading import load_tokenizer
from roll.models.tiny import build_tiny_model
from roll.pipeline.setup.builders import init_ray
from roll.pipeline.setup.rollout_builders import env_spec, sampling_params
from roll.pipeline.tiny_model import env_corpus

CONFIG_DIR = REPO / "examples" / "frozen_lake"
CONFIG_NAME = "agent_val_frozen_lake"
MODES = ("batched", "per_request", "env_only")


class PerRequestClient:
    """One `InferenceWorker.generate` Ray call per request, counted as the batching client counts."""

    def __init__(self, inference):
        self.inference = inference
        self.calls = self.requests = 0

    def release_session(self, session_id: str) -> None:
        self.inference.release_session.remote(session_id)

    async def generate(self, request):
        self.calls += 1
        self.requests += 1
        return await self.inference.generate.remote(request)


class InstantEngine:
    """Answers every request at once with `token` (one call per request, no Ray, no model)."""

    def __init__(self, token: int):
        self.token = token
        self.calls = self.requests = 0

    def release_session(self, session_id: str) -> None:
        pass

    async def generate(self, request):
        self.calls += 1
        self.requests += 1
        return GenerateOutput(request.request_id, [self.token], [-1.0], "length", policy_version=0)


@dataclass
class Run:
    mode: str
    seconds: float
    calls: int
    requests: int
    token_ids: list  # per trajectory, per step: the sampled ids (traj_id order)


async def play(worker: EnvWorker, scheduler: RolloutScheduler, step: int, num_groups: int, mode: str) -> Run:
    """One training step's rollout: every group of `step` at once, as the scheduler starts them."""
    start = time.perf_counter()
    results = await asyncio.gather(
        *(worker.run_group(j, scheduler.group_spec(step, j, False)) for j in range(num_groups))
    )
    seconds = time.perf_counter() - start
    trajs = sorted((t for r in results for t in r.trajectories), key=lambda t: t.traj_id)
    dropped = [cause for r in results for cause in r.dropped]
    if dropped:
        raise RuntimeError(f"{mode}: {len(dropped)} trajectories dropped, e.g. {dropped[0]}")
    ids = [[s.response_ids for s in t.steps] for t in trajs]
    return Run(mode, seconds, sum(r.engine_calls for r in results), sum(r.engine_requests for r in results), ids)


async def measure(cfg, model: str, inference, repeats: int) -> dict[str, list[Run]]:
    manager = cfg.train_env_manager
    tokenizer = load_tokenizer(model)
    specs = [env_spec(cfg, tag, manager) for tag, n in manager.groups_per_tag.items() for _ in range(n)]
    sampling = sampling_params(cfg.generating_args_for(manager), tokenizer)
    workers = {}
    for mode in MODES:
        workers[mode] = EnvWorker(
            specs,
            manager.group_size,
            model,
            inference,
            sampling,
            cfg.sequence_length,
            manager_type=manager.env_manager_type,
            history_length=manager.history_length,
        )
    workers["per_request"]._gateway = InferenceGateway([PerRequestClient(inference)])
    workers["env_only"]._gateway = InferenceGateway([InstantEngine(tokenizer.convert_tokens_to_ids("Left"))])
    scheduler = RolloutScheduler([], [], seed=cfg.seed, mode="train")
    for mode in MODES:  # warm-up: first calls, lazy imports
        await play(workers[mode], scheduler, 0, len(specs), mode)
    runs: dict[str, list[Run]] = {mode: [] for mode in MODES}
    order = list(MODES)
    for step in range(1, repeats + 1):
        for mode in order:
            runs[mode].append(await play(workers[mode], scheduler, step, len(specs), mode))
        print(f"repeat {step}: " + ", ".join(f"{m} {runs[m][-1].seconds:.2f} s" for m in order), flush=True)
        order = order[1:] + order[:1]
    return runs


def print_table(runs: dict[str, list[Run]], load_before, load_after) -> dict[str, float]:
    median = {m: statistics.median(r.seconds for r in rs) for m, rs in runs.items()}
    calls = {m: statistics.median(r.calls for r in rs) for m, rs in runs.items()}
    requests = {m: statistics.median(r.requests for r in rs) for m, rs in runs.items()}
    same = sum(a.token_ids == b.token_ids for a, b in zip(runs["batched"], runs["per_request"]))
    print(f"\nload average (1, 5, 15 min): before {fmt(load_before)}, after {fmt(load_after)}")
    header = f"{'mode':<12}{'rollout s':>10}{'(min-max)':>14}{'calls':>8}{'requests':>10}{'req/call':>10}"
    print(header + f"{'s/batched':>11}")
    for mode in MODES:
        spread = f"{min(r.seconds for r in runs[mode]):.2f}-{max(r.seconds for r in runs[mode]):.2f}"
        ray_calls = (f"{calls[mode]:>8.0f}", f"{requests[mode] / max(calls[mode], 1):>10.1f}")
        if mode == "env_only":  # no Ray call: the engine is in-process
            ray_calls = (f"{'-':>8}", f"{'-':>10}")
        print(
            f"{mode:<12}{median[mode]:>10.2f}{spread:>14}{ray_calls[0]}{requests[mode]:>10.0f}"
            f"{ray_calls[1]}{median[mode] / median['batched']:>11.2f}"
        )
    print(f"same ids (batched vs per_request): {same} of {len(runs['batched'])} repeats")
    return {
        "calls_ratio": calls["per_request"] / max(calls["batched"], 1),
        "rollout_ratio": median["per_request"] / median["batched"],
        "env_only_share": median["env_only"] / median["batched"],
    }


def fmt(load) -> str:
    return " ".join(f"{x:.2f}" for x in load)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--engine_threads", type=int, default=1, help="torch threads of the inference worker")
    parser.add_argument("overrides", nargs="*", help="hydra overrides of the example config")
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "tiny", corpus=env_corpus("frozen_lake", {}))
        overrides = [f"pretrain={model}", f"output_dir={tmp}/out", *args.overrides]
        cfg = load_config(str(CONFIG_DIR), CONFIG_NAME, overrides)
        init_ray(None)
        try:
            infer = cfg.actor_infer
            inference = (
                ray.remote(InferenceWorker)
                .options(num_cpus=0)
                .remote(
                    infer.model_args.model_name_or_path,
                    dtype=infer.model_args.dtype,
                    num_threads=args.engine_threads,
                    max_batch_size=int(infer.strategy_args.strategy_config["max_batch_size"]),
                )
            )
            runs = asyncio.run(measure(cfg, model, inference, args.repeats))
        finally:
            ray.shutdown()
    ratios = print_table(runs, load_before, os.getloadavg())
    print(result_line("", ratios))


if __name__ == "__main__":
    main()
