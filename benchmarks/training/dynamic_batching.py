"""Dynamic batching (token-budget micro-batches) vs fixed micro-batches of `--micro_batch` rows:
padding fraction and tokens/s of a training step and of a log-prob forward, on the same batch.

The batch looks like trajectory-wise multi-turn samples: each row is a prompt of `--prompt` tokens
and 1 to `--max_turns` turns (the count drawn uniformly) of 20 to `--turn` tokens each (uniform),
so lengths spread from about `--prompt` to `--prompt + max_turns * turn`, in random order (the
order PPO's shuffled mini-batches have). Fixed micro-batches take `--micro_batch` consecutive rows
and trim each to its longest row (what the strategy did before). Dynamic batching sorts rows by
length and packs them under a budget of `--micro_batch` x the longest row rounded up to `--round`
tokens (the same worst-case memory as a fixed micro-batch), padded to multiples of `--round`.

Both variants train the same weights (one `torch` strategy each, from the same seed) on the same
rows with the same token-weighted loss, so the losses agree (printed); they take turns within each
repeat and the time is the minimum over `--repeats`. tokens/s counts real (attended) tokens.

    python benchmarks/training/dynamic_batching.py [--rows 64 --micro_batch 4 --prompt 120 --max_turns 8 --turn 60]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from tensordict import TensorDict
from transformers import Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: import from this checkout
from roll.configs.worker import TrainingArgs
from roll.distributed.dynamic_batching import TokenBudget, bin_by_tokens, padding_fraction, round_up, row_lengths
from roll.distributed.micro_batches import token_logprobs
from roll.distributed.strategies.registry import build_train_strategy


def multi_turn_batch(args: argparse.Namespace, vocab: int) -> TensorDict:
    generator = torch.Generator().manual_seed(0)
    turns = torch.randint(1, args.max_turns + 1, (args.rows,), generator=generator)
    lengths = [args.prompt + int(torch.randint(20, args.turn + 1, (int(n),), generator=generator).sum()) for n in turns]
    width = max(lengths)
    positions = torch.arange(width)
    length = torch.tensor(lengths)[:, None]
    mask = (positions < length).long()
    return TensorDict(
        {
            "input_ids": torch.randint(1, vocab, (args.rows, width), generator=generator) * mask,
            "attention_mask": mask,
            "response_mask": ((positions >= args.prompt) & (positions < length)).float(),
            "advantages": torch.randn(args.rows, width, generator=generator),
        },
        batch_size=[args.rows],
    )


def loss_fn(model, micro):
    logprobs, _ = token_logprobs(model, micro["input_ids"], micro["attention_mask"], 1.0)
    mask = micro["response_mask"]
    loss = -(logprobs * micro["advantages"] * mask).sum() / mask.sum().clamp(min=1)
    return loss, {"loss": loss.detach()}


def fixed_padding(lengths: list[int], micro_batch: int) -> float:
    bins = [list(range(i, min(i + micro_batch, len(lengths)))) for i in range(0, len(lengths), micro_batch)]
    return padding_fraction(lengths, bins)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--micro_batch", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=120)
    parser.add_argument("--max_turns", type=int, default=8)
    parser.add_argument("--turn", type=int, default=60)
    parser.add_argument("--round", type=int, default=16)
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
    )
    batch = multi_turn_batch(args, vocab)
    lengths = row_lengths(batch["attention_mask"])
    budget = TokenBudget(args.micro_batch * round_up(max(lengths), args.round), args.round)
    training = TrainingArgs(per_device_train_batch_size=args.micro_batch, learning_rate=1e-5)
    strategies = {}
    for name, dynamic in (("fixed", None), ("dynamic", budget)):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config)
        strategies[name] = build_train_strategy(
            model, training, total_steps=args.repeats, metric_prefix="actor", train_budget=dynamic, infer_budget=dynamic
        )
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
    bins = bin_by_tokens(lengths, budget)
    padding = {
        "fixed": fixed_padding(lengths, args.micro_batch),
        "dynamic": padding_fraction(lengths, bins, args.round),
    }
    micros = {"fixed": -(-args.rows // args.micro_batch), "dynamic": len(bins)}
    print(
        f"batch: {args.rows} rows, lengths {min(lengths)}..{max(lengths)} (mean {tokens / len(lengths):.0f}); "
        f"budget {budget.max_tokens} tokens, round {args.round}; model {args.layers} layers x {args.hidden}; "
        f"load {os.getloadavg()[0]:.1f}"
    )
    print("| micro-batches | count | padding | train tok/s | log-prob tok/s | first-step loss |")
    print("|---|---|---|---|---|---|")
    for name in strategies:
        print(
            f"| {name} | {micros[name]} | {padding[name]:.1%} | {tokens / times[name, 'train']:.0f} | "
            f"{tokens / times[name, 'logprobs']:.0f} | {losses[name]:.6f} |"
        )
    train_ratio = times["fixed", "train"] / times["dynamic", "train"]
    infer_ratio = times["fixed", "logprobs"] / times["dynamic", "logprobs"]
    print(
        f"RESULT dynamic_over_fixed_train_tokens_per_s={train_ratio:.2f} "
        f"dynamic_over_fixed_logprob_tokens_per_s={infer_ratio:.2f} "
        f"padding_fixed={padding['fixed']:.3f} padding_dynamic={padding['dynamic']:.3f}"
    )


if __name__ == "__main__":
    main()
