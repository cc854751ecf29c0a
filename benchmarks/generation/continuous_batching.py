"""Continuous vs batch-at-a-time batching in the `hf` engine, on the same staggered requests.

Both modes run the same `InferenceWorker` (in-process, the tiny FrozenLake model) with
`continuous_batching` on or off. `--requests` requests arrive at seeded Poisson times
(`--rate` per second), each with a random prompt of `--prompt_len` ±50% ids and a random budget
of 1..`--max_new_tokens` new tokens (sampled at temperature 1 with its own seed; the eos id still
stops a row). Batch-at-a-time serves whatever is queued, decodes until the longest row is done and
only then looks at the queue again; continuous lets a request join the running batch at the next
decode step and answers each row when it stops.

Reported per mode: generated tokens/s (all tokens over the wall time from the first arrival to
the last answer), tokens per CPU-second of this process (less sensitive to other processes'
load than wall time), p50 / p99 request latency (answer time minus arrival time), engine calls,
prefill model calls and decode steps; the outputs of the two modes are compared token for token. The modes take turns
within each repeat; each cell is the median over `--repeats`. The machine's 1-minute load average
is printed at the start and end (the machine may be shared).

    python benchmarks/generation/continuous_batching.py [--requests 96 --rate 40 --threads 2 --repeats 3]

The last line is machine-readable: `RESULT continuous_vs_batch_tokens_per_s=<ratio> ...`
(`--batch_wait_ms W` adds a third mode, continuous with that `batch_wait_ms`.).
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
from roll.core.records import GenerateOutput, GenerateRequest, SamplingParams
from roll.distributed.workers.inference import InferenceWorker
from roll.models.loading import load_tokenizer
from roll.pipeline.tiny_model import main as build_tiny

MODES = {"batch-at-a-time": (False, 0.0), "continuous": (True, 0.0)}


def staggered_requests(vocab: int, args) -> list[tuple[float, GenerateRequest]]:
    """(arrival second, request) pairs, the same for every mode."""
    rng = np.random.default_rng(0)
    arrivals = np.cumsum(rng.exponential(1.0 / args.rate, args.requests))
    arrivals -= arrivals[0]
    out = []
    for i, at in enumerate(arrivals):
        length = int(rng.integers(args.prompt_len // 2, args.prompt_len * 3 // 2 + 1))
        prompt = rng.integers(3, vocab, length).tolist()
        params = SamplingParams(max_new_tokens=int(rng.integers(1, args.max_new_tokens + 1)), temperature=1.0)
        out.append((float(at), GenerateRequest(f"r{i}", prompt, params, seed=i)))
    return out


async def serve(worker: InferenceWorker, timed: list[tuple[float, GenerateRequest]]):
    """Send each request at its arrival time; returns (wall s, latencies s, outputs)."""
    start = time.perf_counter()

    async def one(at: float, request: GenerateRequest) -> tuple[float, GenerateOutput]:
        await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
        sent = time.perf_counter()
        out = await worker.generate(request)
        return time.perf_counter() - sent, out

    done = await asyncio.gather(*(one(at, r) for at, r in timed))
    wall = time.perf_counter() - start
    await worker._loop_task  # the engine call ends once idle (it counts itself then)
    return wall, [d[0] for d in done], [d[1] for d in done]


def run_mode(model_dir: str, mode: tuple[bool, float], timed, threads: int) -> dict:
    continuous, wait_ms = mode
    worker = InferenceWorker(
        model_dir, num_threads=threads, max_batch_size=256, continuous_batching=continuous, batch_wait_ms=wait_ms
    )

    async def warm_then_measure():  # one event loop: the worker's asyncio objects belong to it
        await serve(worker, timed[:1])  # warm-up, not counted
        before = worker.get_stats()
        return before, await serve(worker, timed), worker.get_stats()

    cpu_start = time.process_time()
    before, (wall, latencies, outputs), after = asyncio.run(warm_then_measure())
    cpu = time.process_time() - cpu_start  # includes the warm-up request: a few forwards
    tokens = sum(len(o.token_ids) for o in outputs)
    return {
        "tokens_per_s": tokens / wall,
        "p50_s": float(np.percentile(latencies, 50)),
        "p99_s": float(np.percentile(latencies, 99)),
        "wall_s": wall,
        "tokens": tokens,
        "engine_calls": after["engine_calls"] - before["engine_calls"],
        "decode_steps": after["decode_steps"] - before["decode_steps"],
        "prefill_calls": after["prefill_calls"] - before["prefill_calls"],
        "tokens_per_cpu_s": tokens / cpu,
        "outputs": [o.token_ids for o in outputs],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--rate", type=float, default=40.0, help="mean arrivals per second")
    parser.add_argument("--prompt_len", type=int, default=48)
    parser.add_argument("--max_new_tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--batch_wait_ms",
        type=float,
        default=0.0,
        help="> 0 adds a continuous row with this batch_wait_ms (a joiner waits for company)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = build_tiny(["--preset", "frozen_lake", "--output_dir", tempfile.mkdtemp() + "/tiny"])
    timed = staggered_requests(len(load_tokenizer(model_dir)), args)
    load_start = os.getloadavg()[0]
    modes = dict(MODES)
    if args.batch_wait_ms > 0:
        modes[f"continuous+{args.batch_wait_ms:g}ms"] = (True, args.batch_wait_ms)
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for repeat in range(args.repeats):
        order = list(modes) if repeat % 2 == 0 else list(modes)[::-1]  # take turns
        for mode in order:
            runs[mode].append(run_mode(model_dir, modes[mode], timed, args.threads))
    load_end = os.getloadavg()[0]
    identical = all(r["outputs"] == runs["batch-at-a-time"][0]["outputs"] for rs in runs.values() for r in rs)
    med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "outputs"} for m, rs in runs.items()}

    print(
        f"\n{args.requests} requests, Poisson arrivals at {args.rate}/s over "
        f"{timed[-1][0]:.2f} s, prompts ~{args.prompt_len} ids, 1..{args.max_new_tokens} new tokens, "
        f"{args.threads} torch threads; median of {args.repeats}; load {load_start:.1f} -> {load_end:.1f}"
    )
    print(
        f"{'mode':<20}{'tokens/s':>10}{'tok/cpu-s':>10}{'p50 s':>9}{'p99 s':>9}{'wall s':>9}{'calls':>7}"
        f"{'prefills':>9}{'steps':>7}"
    )
    for mode, m in med.items():
        print(
            f"{mode:<20}{m['tokens_per_s']:>10.1f}{m['tokens_per_cpu_s']:>10.1f}{m['p50_s']:>9.3f}{m['p99_s']:>9.3f}"
            f"{m['wall_s']:>9.2f}{m['engine_calls']:>7.0f}{m['prefill_calls']:>9.0f}{m['decode_steps']:>7.0f}"
        )
    base, result = med["batch-at-a-time"], []
    for mode in list(modes)[1:]:
        m, label = med[mode], mode.replace("-", "_").replace("+", "_wait").replace(".", "_")
        ratios = {
            "tokens_per_s": m["tokens_per_s"] / base["tokens_per_s"],
            "tokens_per_cpu_s": m["tokens_per_cpu_s"] / base["tokens_per_cpu_s"],
            "p50_latency": base["p50_s"] / m["p50_s"],
            "p99_latency": base["p99_s"] / m["p99_s"],
        }
        print(
            f"{mode} vs batch-at-a-time: "
            + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items())
            + " (latency: batch / this, higher is better)"
        )
        result += [f"{label}_vs_batch_{k}={v:.3f}" for k, v in ratios.items()]
    print(f"outputs identical token for token across modes and repeats: {identical}")
    print("\nRESULT " + " ".join(result) + f" identical_outputs={int(identical)} load_start={load_start:.1f}")


if __name__ == "__main__":
    main()
