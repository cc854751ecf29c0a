"""ActorWorker.train() computing each distinct row once vs every row, side by side in one process.

The batch is step-wise-like, as FrozenLake with one-token answers: `--rows` rows of `--seq_len`
tokens, each a prompt drawn from `--prompts` (a small map has few states, and every rollout of a
group revisits them) followed by a one-token answer drawn from `--answers` (early in training the
policy answers almost anything), with its own advantage on that answer. Rows are distinct when
they differ before their last token (roll.distributed.micro_batches); the table shows that ratio next to
the one of the whole-row key it replaced, under which rows with other answers were distinct.

Two workers with the same weights train on the batch in turn, one with `dedupe_rows=False`; each
time is the minimum over `--repeats` calls. Both take the same optimizer steps, so the last line
shows how far apart their weights end up (float noise). Training deduplicates within a PPO
mini-batch (each mini-batch is a step of different weights), so its gain depends on
`--mini_batch`; `compute_logprobs` deduplicates the whole batch.

    python benchmarks/training/train_dedupe.py [--rows 1024 --prompts 100 --answers 16 --seq_len 32 --mini_batch 512]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
from tensordict import TensorDict

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: import from this checkout
from roll.algorithms.actor_loss import PolicyLossOptions
from roll.configs.worker import TrainingArgs
from roll.distributed.micro_batches import PADDING_KEY, distinct_rows
from roll.distributed.workers.actor import ActorWorker
from roll.distributed.workers.common import shuffled_minibatches
from roll.models.tiny import build_tiny_model

MICRO_BATCH = 16  # rows per forward pass
LOSS = PolicyLossOptions(entropy_coef=0.01)  # temperature 1, PPO clip 0.2, token-mean


def step_wise_batch(rows: int, prompts: int, answers: int, seq_len: int, vocab_size: int) -> TensorDict:
    """`rows` rows: a prompt of `seq_len - 1` tokens from `prompts`, then an answer token from
    `answers`, both drawn with replacement; the answer is the response."""
    generator = torch.Generator().manual_seed(0)
    prompt_pool = torch.randint(1, vocab_size, (prompts, seq_len - 1), generator=generator)
    answer_pool = torch.randperm(vocab_size - 1, generator=generator)[:answers] + 1
    prompt = prompt_pool[torch.randint(0, prompts, (rows,), generator=generator)]
    answer = answer_pool[torch.randint(0, answers, (rows, 1), generator=generator)]
    input_ids = torch.cat([prompt, answer], dim=1)
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


def whole_row_ratio(batch: TensorDict) -> float:
    """Distinct rows / rows under the previous key: every attended token, the last one included."""
    key = torch.where(batch["attention_mask"].bool(), batch["input_ids"], PADDING_KEY)
    return len(torch.unique(key, dim=0)) / len(key)


def last_token_ratio(batch: TensorDict) -> float:
    """Distinct rows / rows under the key training uses: tokens before the last, and the mask."""
    return distinct_rows(batch["input_ids"], batch["attention_mask"]).ratio


def ratios(batch: TensorDict, mini_batch_rows: int, seed: int, step: int) -> dict[str, tuple[float, float]]:
    """Per key: (whole batch, mean over the mini-batches ActorWorker.train(step=step) draws)."""
    minibatches = list(shuffled_minibatches(batch, mini_batch_rows, seed, "minibatch", step, 0))
    return {
        name: (ratio(batch), sum(map(ratio, minibatches)) / len(minibatches))
        for name, ratio in (("whole row (before)", whole_row_ratio), ("up to last token", last_token_ratio))
    }


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
            metrics = worker.train(batch, LOSS, ppo_epochs=1, step=step)
            train_s[dedupe].append(time.perf_counter() - start)
            start = time.perf_counter()
            worker.compute_logprobs(batch, 1.0)
            logprobs_s[dedupe].append(time.perf_counter() - start)
            ratio[dedupe] = metrics["actor/unique_row_ratio"]
    return {dedupe: (min(train_s[dedupe]), min(logprobs_s[dedupe]), ratio[dedupe]) for dedupe in workers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1024, help="rows in the training batch")
    parser.add_argument("--prompts", type=int, default=100, help="distinct prompts rows are drawn from")
    parser.add_argument("--answers", type=int, default=16, help="distinct one-token answers")
    parser.add_argument("--seq_len", type=int, default=32, help="tokens per row")
    parser.add_argument("--mini_batch", type=int, default=512, help="rows per optimizer step")
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
            dedupe: ActorWorker(model_path, training_args, total_train_steps=args.repeats, seed=0, dedupe_rows=dedupe)
            for dedupe in (True, False)
        }
    vocab_size = workers[True].strategy.model.config.vocab_size
    batch = step_wise_batch(args.rows, args.prompts, args.answers, args.seq_len, vocab_size)
    batch["old_logprobs"] = workers[True].compute_logprobs(batch, 1.0)

    rows = measure(workers, batch, args.repeats)

    print(
        f"{args.rows} rows x {args.seq_len} tokens: {args.prompts} prompts x {args.answers} answers, "
        f"mini-batches of {training_args.mini_batch_size}, micro-batches of {MICRO_BATCH}"
    )
    print(f"{'distinct rows / rows':22}{'whole batch':>12}{'mini-batch':>12}")
    last_step = args.repeats - 1
    for name, (whole, mini) in ratios(batch, training_args.mini_batch_size, 0, last_step).items():
        print(f"{name:22}{whole:12.3f}{mini:12.3f}")
    print(f"{'train() metric':22}{'':12}{rows[True][2]:12.3f}  (actor/unique_row_ratio, same mini-batches)")
    print(f"{'':22}{'dedupe (s)':>12}{'every row (s)':>15}{'speed-up':>10}")
    for column, name in ((0, "train()"), (1, "compute_logprobs()")):
        fast, slow = rows[True][column], rows[False][column]
        print(f"{name:22}{fast:12.3f}{slow:15.3f}{slow / fast:9.1f}x")
    weights = [w.get_weights() for w in workers.values()]
    diff = max(float((weights[0][k] - weights[1][k]).abs().max()) for k in weights[0])
    print(f"max |weight difference| after {args.repeats} identical train() calls: {diff:.2e}")


if __name__ == "__main__":
    main()
