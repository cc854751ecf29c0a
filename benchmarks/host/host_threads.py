"""Host-side batch preparation of GPU roles sharing one machine: how many torch threads each should use.

A role on a GPU prepares each batch on the CPU before the forward: it finds the distinct rows
(`micro_batches.batch_rows`: row hashes and grouping) and cuts micro-batches of 512 distinct rows
(`distinct_micro_batch_rows`, `micro_batch`: indexing, trimming), as `forward_in_micro_batches`
does before each forward. torch runs such an op on several threads once it spans more than 32,768
elements. On the H200 run of the GPU lane (docs/gpu.md), where the actor, the reference and the
engine each sized their pool to the machine's 16 cores, the score phase took 0.08 s a step
below that size and 0.35 s above it.

Here `--processes` processes (the colocated roles; default 3) prepare the same step-wise batch at
the same time, `--repeats` times each, for row counts on both sides of 32,768 elements (38 tokens
a row: 850 and 900 rows) and a full step (2,000 rows), once per thread count of `--threads`
(default: this machine's cores, what a GPU role used before, then
`roll.distributed.workers.common.GPU_HOST_THREADS`, then 1). The table gives the median
milliseconds of one preparation over all processes, and each count's ratio to the first.

    python benchmarks/host/host_threads.py [--processes 3 --repeats 200 --threads 16,4,1]

The last line is `RESULT host_threads rows=<N> <threads>t=<ms> ... first_over_gpu_default=<x>`
for the largest row count.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: import from this checkout


TOKENS = 38  # the README example's step rows (prompt and answer)
ROWS = (850, 900, 2000)


def prepare_times(rows: int, threads: int, repeats: int, start, out) -> None:
    """One process: `repeats` preparations of a rows x TOKENS batch (timed each), after `start`."""
    import torch
    from tensordict import TensorDict

    from roll.distributed.micro_batches import batch_rows, distinct_micro_batch_rows, micro_batch

    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(rows)
    ids = torch.randint(0, 64, (rows, TOKENS), generator=gen)
    ids[rows // 2 :] = ids[: rows - rows // 2]  # half the rows repeat others, as step batches do
    batch = TensorDict(
        {
            "input_ids": ids,
            "attention_mask": torch.ones(rows, TOKENS, dtype=torch.long),
            "response_mask": torch.zeros(rows, TOKENS),
            "infer_logprobs": torch.zeros(rows, TOKENS),
        },
        batch_size=[rows],
    )
    start.wait()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        distinct = batch_rows(batch, dedupe=True)
        for members in distinct_micro_batch_rows(distinct, 512, batch["attention_mask"]):
            micro_batch(batch, members)
        times.append(time.perf_counter() - began)
    out.put(times)


def measure(rows: int, threads: int, processes: int, repeats: int) -> float:
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=prepare_times, args=(rows, threads, repeats, start, out)) for _ in range(processes)]
    for p in procs:
        p.start()
    time.sleep(2.0)  # every process has imported torch and built its batch
    start.set()
    times = [t for _ in procs for t in out.get()]
    for p in procs:
        p.join()
    return 1000 * statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    from roll.distributed.workers.common import GPU_HOST_THREADS

    cores = os.cpu_count() or 1
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--threads", default=f"{cores},{min(GPU_HOST_THREADS, cores)},1")
    args = parser.parse_args(argv)
    counts = list(dict.fromkeys(int(t) for t in args.threads.split(",")))
    load = os.getloadavg()
    print(f"{cores} cores, {args.processes} processes at once, {args.repeats} preparations each; load {load[0]:.2f}")
    print(f"{'rows':>6} {'elements':>9} " + " ".join(f"{f'{t} threads ms':>15} {'ratio':>6}" for t in counts))
    result = {}
    for rows in ROWS:
        ms = {t: measure(rows, t, args.processes, args.repeats) for t in counts}
        cells = " ".join(f"{ms[t]:>15.3f} {ms[t] / ms[counts[0]]:>6.2f}" for t in counts)
        print(f"{rows:>6} {rows * TOKENS:>9} {cells}")
        result = ms
    gpu_default = min(GPU_HOST_THREADS, cores)
    ratio = result[counts[0]] / result[gpu_default] if gpu_default in result else float("nan")
    print(f"load after: {os.getloadavg()[0]:.2f}")
    print(
        f"RESULT host_threads rows={ROWS[-1]} "
        + " ".join(f"{t}t={result[t]:.3f}ms" for t in counts)
        + f" first_over_gpu_default={ratio:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
