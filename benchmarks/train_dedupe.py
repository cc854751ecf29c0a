"""ActorWorker.train() computing each distinct row once vs every row, side by side in one process.

The batch is step-wise-like: `--rows` rows of `--seq_len` tokens drawn from `--distinct` distinct
rows (a small map has few states, and every rollout of a group revisits them), each with its own
advantage and one response token (the last). Two workers with the same weights train on it in
turn, one with `dedupe_rows=False`; each time is the minimum over `--repeats` calls. Both take the
same optimizer steps, so the last line shows how far apart their weights end up (float noise).

Training deduplicates within a PPO mini-batch (each mini-batch is a step of different weights), so
its gain depends on `--mini_batch`; `compute_logprobs` deduplicates the whole batch.

    python benchmarks/train_dedupe.py [--rows 1024 --distinct 150 --seq_len 32 --mini_batch 256]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
from tensordict import TensorDict

from roll.configs.worker import TrainingArgs
from roll.distributed.batch import distinct_rows
from roll.distributed.workers.actor import ActorWorker
from roll.models.tiny import build_tiny_model

MICRO_BATCH = 16  # rows per forward pass
TRAIN_KW = {"temperature": 1.0, "pg_clip": 0.2, "entropy_loss_coef": 0.01, "loss_agg_mode": "token-mean"}


def step_wise_batch(rows: int, distinct: int, seq_len: int, vocab_size: int) -> TensorDict:
    """`rows` rows drawn with replacement from `distinct` random rows; the last token is the response."""
    generator = torch.Generator().manual_seed(0)
    pool = torch.randint(1, vocab_size, (distinct, seq_len), generator=generator)
    input_ids = pool[torch.randint(0, distinct, (rows,), generator=generator)]
    response_mask = torch.zeros(rows, seq_len)
    response_mask[:, -1] = 1
    return TensorDict(
        {
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids),
            "response_mask": response_mask,
            "advantages": torch.randn(rows, 1, generator=generator) * response_mask,
        },
        batch_size=[rows],
    )


def measure(
    workers: dict[bool, ActorWorker], batch: TensorDict, repeats: int
) -> dict[bool, tuple[float, float, float]]:
    """Per worker: best train() and compute_logprobs() seconds, and train()'s unique_row_ratio.

    The variants take turns within each repeat, so a load spike from another process on the
    machine hits both; one untimed compute_logprobs() per worker first pays one-off start-up costs.
    """
    for worker in workers.values():
        worker.compute_logprobs(batch, 1.0)
    train_s: dict[bool, list[float]] = {dedupe: [] for dedupe in workers}
    logprobs_s: dict[bool, list[float]] = {dedupe: [] for dedupe in workers}
    ratio: dict[bool, float] = {}
    for step in range(repeats):
        for dedupe, worker in workers.items():
            start = time.perf_counter()
            metrics = worker.train(batch, ppo_epochs=1, step=step, **TRAIN_KW)
            train_s[dedupe].append(time.perf_counter() - start)
            start = time.perf_counter()
            worker.compute_logprobs(batch, 1.0)
            logprobs_s[dedupe].append(time.perf_counter() - start)
            ratio[dedupe] = metrics["actor/unique_row_ratio"]
    return {dedupe: (min(train_s[dedupe]), min(logprobs_s[dedupe]), ratio[dedupe]) for dedupe in workers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1024, help="rows in the training batch")
    parser.add_argument("--distinct", type=int, default=150, help="distinct rows they are drawn from")
    parser.add_argument("--seq_len", type=int, default=32, help="tokens per row")
    parser.add_argument("--mini_batch", type=int, default=256, help="rows per optimizer step")
    parser.add_argument("--repeats", type=int, default=3, help="calls per variant; the minimum is kept")
    args = parser.parse_args()

    training_args = TrainingArgs(
        learning_rate=1e-4,
        per_device_train_batch_size=MICRO_BATCH,
        gradient_accumulation_steps=max(args.mini_batch // MICRO_BATCH, 1),
    )
    with tempfile.TemporaryDirectory() as tmp:
        model_path = build_tiny_model(tmp)
        workers = {
            dedupe: ActorWorker(
                model_path, training_args, total_train_steps=args.repeats, seed=0, dedupe_rows=dedupe
            )
            for dedupe in (True, False)
        }
    vocab_size = workers[True].strategy.model.config.vocab_size
    batch = step_wise_batch(args.rows, args.distinct, args.seq_len, vocab_size)
    batch["old_logprobs"] = workers[True].compute_logprobs(batch, 1.0)

    rows = measure(workers, batch, args.repeats)

    whole_ratio = distinct_rows(batch["input_ids"], batch["attention_mask"]).ratio
    print(
        f"{args.rows} rows x {args.seq_len} tokens from {args.distinct} distinct rows, "
        f"mini-batches of {training_args.mini_batch_size}, micro-batches of {MICRO_BATCH}"
    )
    print(f"unique rows / rows: whole batch {whole_ratio:.3f}, mini-batch mean {rows[True][2]:.3f}")
    print(f"{'':18}{'dedupe (s)':>12}{'every row (s)':>15}{'speed-up':>10}")
    for column, name in ((0, "train()"), (1, "compute_logprobs()")):
        fast, slow = rows[True][column], rows[False][column]
        print(f"{name:18}{fast:12.3f}{slow:15.3f}{slow / fast:9.1f}x")
    weights = [w.get_weights() for w in workers.values()]
    diff = max(float((weights[0][k] - weights[1][k]).abs().max()) for k in weights[0])
    print(f"max |weight difference| after {args.repeats} identical train() calls: {diff:.2e}")


if __name__ == "__main__":
    main()
