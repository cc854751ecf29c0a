"""Sequence packing (ROLL's use_sequence_packing) vs padded micro-batches: padding removed and
tokens/s of a training step and of a log-prob forward, on multi-turn batches whose lengths spread 4x.

Two length distributions, each with max/min = `--spread` (one row at each end):
- uniform: lengths drawn uniformly over [`--shortest`, spread x shortest];
- agent: multi-turn agent episodes, `--prompt` tokens + turns x `--turn` tokens, turns geometric
  (P(turns = k) = p (1 - p)^(k - 1), p = `--p_stop`, most episodes short, a few long) and clipped
  to the turn count that makes the spread, which one episode takes; one episode has one turn.
Rows come in random order. The variants, each its own `torch` strategy from the same seed with the
same token-weighted loss (first-step losses printed; they agree to round-off):
- padded: micro-batches of `--micro_batch` consecutive rows, each trimmed to its longest row;
- packed: the same micro-batches, each run as one packed row (algorithm "none"), attention per row;
- packed + load_balance: ROLL's plan, max_packed_sequence_length = `--micro_batch` x the longest row
  (the padded micro-batch's worst-case token count);
- with `--mask_path`, also packed through transformers' block-diagonal mask over the whole packed
  row (what packing did before roll.distributed.segment_attention).
The model is Qwen2-0.5B's layer shape (width 896, 14 heads, 2 KV heads, MLP 4864) with only
`--layers` layers and a `--vocab` vocabulary (tied embeddings) so that a run takes minutes on CPU;
random init, built here. tokens/s counts real tokens; each time is the minimum over `--repeats`,
the variants taking turns within each repeat so that load from other processes hits them all.

    python benchmarks/training/sequence_packing.py [--rows 16 --micro_batch 4 --shortest 64 --prompt 48 --turn 24]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: import from this checkout
from tensordict import TensorDict
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from benchmarks.training.dynamic_batching import loss_fn
from roll.configs.worker import TrainingArgs
from roll.distributed.segment_attention import segment_kwargs, segment_sdpa_attention
from roll.distributed.sequence_packing import PackingBudget
from roll.distributed.strategies.registry import build_train_strategy


def uniform_lengths(args: argparse.Namespace, generator: torch.Generator) -> list[int]:
    """Uniform over [shortest, spread x shortest], the first two rows at the two ends."""
    low, high = args.shortest, args.spread * args.shortest
    lengths = [low, high] + torch.randint(low, high + 1, (args.rows - 2,), generator=generator).tolist()
    return [lengths[i] for i in torch.randperm(args.rows, generator=generator)]


def agent_lengths(args: argparse.Namespace, generator: torch.Generator) -> list[int]:
    """prompt + turns x turn, turns geometric clipped to the spread; one row at each end."""
    most = (args.spread * (args.prompt + args.turn) - args.prompt) // args.turn
    uniform = torch.rand(args.rows - 2, generator=generator)
    geometric = (torch.log1p(-uniform) / torch.log1p(torch.tensor(-args.p_stop))).floor().long() + 1
    turns = [1, most] + geometric.clamp(max=most).tolist()
    return [args.prompt + args.turn * turns[i] for i in torch.randperm(args.rows, generator=generator)]


def batch_of(lengths: list[int], prompt: int, vocab: int, generator: torch.Generator) -> TensorDict:
    """Right-padded rows of `lengths` tokens; responses after the first `prompt` tokens."""
    positions = torch.arange(max(lengths))
    length = torch.tensor(lengths)[:, None]
    mask = (positions < length).long()
    return TensorDict(
        {
            "input_ids": torch.randint(1, vocab, mask.shape, generator=generator) * mask,
            "attention_mask": mask,
            "response_mask": ((positions >= prompt) & (positions < length)).float(),
            "advantages": torch.randn(mask.shape, generator=generator),
        },
        batch_size=[len(lengths)],
    )


def padded_tokens(lengths: list[int], micro_batch: int) -> int:
    """Tokens the model runs on with padded micro-batches of `micro_batch` consecutive rows."""
    return sum(
        len(lengths[i : i + micro_batch]) * max(lengths[i : i + micro_batch])
        for i in range(0, len(lengths), micro_batch)
    )


def per_row_share(lengths: list[int], micro_batch: int) -> float:
    """The attention work of packed rows attended row by row over that of the whole packed rows."""
    chunks = [lengths[i : i + micro_batch] for i in range(0, len(lengths), micro_batch)]
    return sum(n * n for chunk in chunks for n in chunk) / sum(sum(chunk) ** 2 for chunk in chunks)


def qwen2_shape(args: argparse.Namespace) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=args.vocab, hidden_size=896, intermediate_size=4864, num_hidden_layers=args.layers,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True,
        attn_implementation="sdpa",
    )  # fmt: skip


def measure(args: argparse.Namespace, lengths: list[int], batch: TensorDict) -> dict:
    """{variant: (micro-batches, padding, train s, log-prob s, first-step loss)}, times the minima."""
    plan = PackingBudget(args.micro_batch * max(lengths))
    variants = {"padded": (False, None), "packed": (True, None), "packed + load_balance": (True, plan)}
    if args.mask_path:
        variants["packed, whole-row mask"] = (True, None)
    training = TrainingArgs(per_device_train_batch_size=args.micro_batch, learning_rate=1e-5)
    strategies = {}
    for name, (packing, budget) in variants.items():
        torch.manual_seed(0)
        strategies[name] = build_train_strategy(
            Qwen2ForCausalLM(qwen2_shape(args)), training, total_steps=args.repeats, metric_prefix="actor",
            train_budget=budget, infer_budget=budget, sequence_packing=packing,
        )  # fmt: skip
    times = {(name, phase): float("inf") for name in strategies for phase in ("train", "logprobs")}
    losses = {}
    for _ in range(args.repeats):
        for name, strategy in strategies.items():
            whole_row_mask = "mask" in name
            path = mock.patch("roll.distributed.sequence_packing.uses_segment_attention", return_value=False)
            with path if whole_row_mask else nullcontext():
                start = time.perf_counter()
                strategy.forward_logprobs(batch.select("input_ids", "attention_mask"), 1.0)
                times[name, "logprobs"] = min(times[name, "logprobs"], time.perf_counter() - start)
                start = time.perf_counter()
                losses.setdefault(name, strategy.train_step(batch, loss_fn)["loss"])
                times[name, "train"] = min(times[name, "train"], time.perf_counter() - start)
    count = -(-len(lengths) // args.micro_batch)
    padding = 1 - sum(lengths) / padded_tokens(lengths, args.micro_batch)
    return {
        name: (
            len(plan.bins(lengths)) if "load_balance" in name else count,
            padding if name == "padded" else 0.0,
            times[name, "train"],
            times[name, "logprobs"],
            losses[name],
        )
        for name in strategies
    }


def attention_alone(lengths: list[int], micro_batch: int, repeats: int) -> dict[str, float]:
    """Seconds of one attention forward over the micro-batches (minimum of `repeats` each): padded
    rows with their padding mask, a packed row through the block-diagonal mask of the whole row,
    and a packed row attended row by row (segment_sdpa_attention)."""
    times = dict.fromkeys(("padded", "packed, whole-row mask", "packed, per row"), 0.0)
    for first in range(0, len(lengths), micro_batch):
        rows = torch.tensor(lengths[first : first + micro_batch])
        for name in times:
            times[name] += min(attention_seconds(name, rows) for _ in range(max(repeats, 5)))
    return times


def attention_seconds(name: str, rows: torch.Tensor) -> float:
    """One attention forward of the micro-batch of `rows` tokens, the `name` way of
    `attention_alone`, with the model's heads: 14 query heads, 2 KV heads, 64 dims."""
    module = SimpleNamespace(num_key_value_groups=7, is_causal=True)
    batch, length = (len(rows), int(rows.max())) if name == "padded" else (1, int(rows.sum()))
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(batch, 14, length, 64, generator=generator)
    key, value = (torch.randn(batch, 2, length, 64, generator=generator) for _ in range(2))
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    if name == "padded":
        mask = (torch.arange(length)[None, :] < rows[:, None])[:, None, None, :] & causal
    else:
        segment = torch.repeat_interleave(torch.arange(len(rows)), rows)
        mask = ((segment[:, None] == segment[None, :]) & causal)[None, None]
    start = time.perf_counter()
    if name == "packed, per row":
        segment_sdpa_attention(module, query, key, value, None, **segment_kwargs(rows))
    else:
        sdpa_attention_forward(module, query, key, value, mask)
    return time.perf_counter() - start


def report(label: str, lengths: list[int], results: dict, micro_batch: int, repeats: int) -> None:
    tokens = sum(lengths)
    print(
        f"\n{label}: {len(lengths)} rows, lengths {min(lengths)}..{max(lengths)} "
        f"({max(lengths) / min(lengths):.1f}x, mean {tokens / len(lengths):.0f}, {tokens} tokens); "
        f"load {os.getloadavg()[0]:.1f}"
    )
    print("| micro-batches | count | padding | train tok/s | log-prob tok/s | first-step loss |")
    print("|---|---|---|---|---|---|")
    for name, (count, padding, train, logprobs, loss) in results.items():
        print(f"| {name} | {count} | {padding:.1%} | {tokens / train:.0f} | {tokens / logprobs:.0f} | {loss:.6f} |")
    alone = attention_alone(lengths, micro_batch, repeats)
    print(
        "attention alone, one layer's forward over the micro-batches: "
        + ", ".join(f"{name} {seconds * 1000:.0f} ms" for name, seconds in alone.items())
        + f" (sum L^2 / (sum L)^2 per micro-batch: {per_row_share(lengths, micro_batch):.2f})"
    )
    _, _, padded_train, padded_logprobs, _ = results["padded"]
    for name, (_, _, train, logprobs, _) in results.items():
        if name != "padded":
            key = name.replace(" + ", "_").replace(", ", "_").replace(" ", "_").replace("-", "_")
            ratios = f"train={padded_train / train:.2f} logprobs={padded_logprobs / logprobs:.2f}"
            print(f"RESULT {label}_{key}_over_padded {ratios}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--micro_batch", type=int, default=4)
    parser.add_argument("--spread", type=int, default=4, help="longest / shortest row")
    parser.add_argument("--shortest", type=int, default=64, help="uniform: the shortest row")
    parser.add_argument("--prompt", type=int, default=48, help="agent: prompt tokens")
    parser.add_argument("--turn", type=int, default=24, help="agent: tokens per turn")
    parser.add_argument("--p_stop", type=float, default=0.4, help="agent: chance an episode ends after a turn")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--mask_path", action="store_true", help="also packed through the whole-row mask")
    parser.add_argument("--only", choices=["uniform", "agent"], help="one distribution only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"model: Qwen2 {args.layers} layers x 896 (14 heads, 2 KV heads, MLP 4864), vocab {args.vocab}, sdpa, "
        f"{args.threads} threads; micro-batches of {args.micro_batch} rows; {args.repeats} repeats; "
        f"load {os.getloadavg()[0]:.1f} at start"
    )
    for label, draw in (("uniform", uniform_lengths), ("agent", agent_lengths)):
        if args.only in (None, label):
            generator = torch.Generator().manual_seed(0)
            lengths = draw(args, generator)
            results = measure(args, lengths, batch_of(lengths, args.prompt, args.vocab, generator))
            report(label, lengths, results, args.micro_batch, args.repeats)


if __name__ == "__main__":
    main()
