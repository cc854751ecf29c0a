"""Sequence packing (ROLL's use_sequence_packing) vs padded micro-batches: padding removed and
tokens/s of a training step and of a log-prob forward, on the same mixed-length multi-turn batch.

The batch is that of benchmarks/dynamic_batching.py: trajectory-wise multi-turn rows of a
`--prompt`-token prompt and 1 to `--max_turns` turns of 20 to `--turn` tokens, in random order, so
lengths spread about 4x by default. Three ways to run it, each its own `torch` strategy from the
same seed, with the same token-weighted loss (first-step losses printed; they agree to round-off):
- padded: micro-batches of `--micro_batch` consecutive rows, each trimmed to its longest row;
- packed: the same micro-batches, each run as one packed row (algorithm "none");
- packed + load_balance: ROLL's plan, max_packed_sequence_length = `--micro_batch` x the longest row
  (the padded micro-batch's worst-case token count).
tokens/s counts real (attended) tokens; the time is the minimum over `--repeats`, the variants
taking turns within each repeat. On CPU, sdpa attends a packed row through a block-diagonal mask
over the whole packed row, so attention does not shrink with packing there (flash attention's
varlen kernels on GPU skip the masked blocks); the matmuls, most of a small model's work, do.

    python benchmarks/sequence_packing.py [--rows 64 --micro_batch 4 --prompt 120 --max_turns 8 --turn 60]
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from dynamic_batching import loss_fn, multi_turn_batch
from transformers import Qwen2Config, Qwen2ForCausalLM

from roll.configs.worker import TrainingArgs
from roll.distributed.dynamic_batching import row_lengths
from roll.distributed.sequence_packing import PackingBudget
from roll.distributed.strategies.registry import build_train_strategy


def padded_tokens(lengths: list[int], micro_batch: int) -> int:
    """Tokens the model runs on with padded micro-batches of `micro_batch` consecutive rows."""
    return sum(
        len(lengths[i : i + micro_batch]) * max(lengths[i : i + micro_batch])
        for i in range(0, len(lengths), micro_batch)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--micro_batch", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=120)
    parser.add_argument("--max_turns", type=int, default=8)
    parser.add_argument("--turn", type=int, default=60)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    vocab = 2048
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64,
        num_key_value_heads=max(1, args.hidden // 256),
        max_position_embeddings=4096,
        attn_implementation="sdpa",
    )
    args.round = 1
    batch = multi_turn_batch(args, vocab)
    lengths = row_lengths(batch["attention_mask"])
    plan = PackingBudget(args.micro_batch * max(lengths))
    training = TrainingArgs(per_device_train_batch_size=args.micro_batch, learning_rate=1e-5)
    variants = {"padded": (False, None), "packed": (True, None), "packed + load_balance": (True, plan)}
    strategies = {}
    for name, (packing, budget) in variants.items():
        torch.manual_seed(0)
        strategies[name] = build_train_strategy(
            Qwen2ForCausalLM(config), training, total_steps=args.repeats, metric_prefix="actor",
            train_budget=budget, infer_budget=budget, sequence_packing=packing,
        )  # fmt: skip
    times = {(name, phase): float("inf") for name in strategies for phase in ("train", "logprobs")}
    losses = {}
    for _ in range(args.repeats):
        for name, strategy in strategies.items():
            start = time.perf_counter()
            strategy.forward_logprobs(batch.select("input_ids", "attention_mask"), 1.0)
            times[name, "logprobs"] = min(times[name, "logprobs"], time.perf_counter() - start)
            start = time.perf_counter()
            losses.setdefault(name, strategy.train_step(batch, loss_fn)["loss"])
            times[name, "train"] = min(times[name, "train"], time.perf_counter() - start)
    tokens = sum(lengths)
    computed = {"padded": padded_tokens(lengths, args.micro_batch)}
    micros = {"padded": -(-args.rows // args.micro_batch), "packed": -(-args.rows // args.micro_batch)}
    micros["packed + load_balance"] = len(plan.bins(lengths))
    print(
        f"batch: {args.rows} rows, lengths {min(lengths)}..{max(lengths)} ({max(lengths) / min(lengths):.1f}x, "
        f"mean {tokens / len(lengths):.0f}); model {args.layers} layers x {args.hidden}, sdpa, "
        f"{args.threads} threads; load {os.getloadavg()[0]:.1f}"
    )
    print("| micro-batches | count | padding | train tok/s | log-prob tok/s | first-step loss |")
    print("|---|---|---|---|---|---|")
    for name in strategies:
        padding = 1 - tokens / computed.get(name, tokens)
        print(
            f"| {name} | {micros[name]} | {padding:.1%} | {tokens / times[name, 'train']:.0f} | "
            f"{tokens / times[name, 'logprobs']:.0f} | {losses[name]:.6f} |"
        )
    for name in ("packed", "packed + load_balance"):
        print(
            f"RESULT {name.replace(' + ', '_')}_over_padded "
            f"train={times['padded', 'train'] / times[name, 'train']:.2f} "
            f"logprobs={times['padded', 'logprobs'] / times[name, 'logprobs']:.2f}"
        )


if __name__ == "__main__":
    main()
