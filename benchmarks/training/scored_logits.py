"""The output head at the scored positions only (`roll.distributed.output_head`) against every position,
side by side in one process.

A model of Qwen2-0.5B's width and vocabulary (hidden 896, 151,936 ids, tied embeddings; `--layers`
of its 24 layers, random init, float32 on CPU) scores and trains on one micro-batch through
`token_logprobs`, in three ways:
- `every_position`: the head maps every position of the (rows, T) batch, padding included, and the
  scored rows are picked afterwards (what a pass did before; Megatron's model still does, having no
  head to narrow);
- `real_tokens`: every real token is scored (no response mask), padding skipped;
- `response`: only response tokens are scored, as the actor and the reference now do.

Two layouts of `--rows` distinct rows: `step` (a step-wise row, as part b of the GPU lane: a prompt of
`--prompt` tokens, each row a random length in its lower half to the full, then a
`--response`-token action) and `traj` (a trajectory-wise row: `--turns` turns of an observation of
`--prompt` / `--turns` tokens and a `--response`-token answer). Each time is the median of
`--repeats` runs, variants alternating. `head_positions` is what the head mapped (measured with a
hook); `logits_mb` is the float32 logits of those positions.

    python benchmarks/training/scored_logits.py [--layers 2 --rows 8 --prompt 96 --response 16 --turns 4 --repeats 5]

The last line is `RESULT scored_logits step_score_ratio=<every/response> step_train_ratio=<..>
traj_score_ratio=<..> traj_train_ratio=<..> step_positions_ratio=<..> traj_positions_ratio=<..>`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: import from this checkout
from torch import nn
from transformers import Qwen2Config, Qwen2ForCausalLM

from benchmarks.common import result_line
from benchmarks.gpu.gpu_e2e import QWEN2_HALF_B
from roll.distributed.micro_batches import token_logprobs


class EveryPosition(nn.Module):
    """The model with its output head hidden: `token_logprobs` then maps every position."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.inner = model

    def forward(self, **kwargs):
        return self.inner(**kwargs)


def layout(kind: str, args: argparse.Namespace, vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, attention mask, response mask) of `args.rows` right-padded rows (module docstring)."""
    generator = torch.Generator().manual_seed(0)
    segments: list[list[tuple[int, bool]]] = []  # (tokens, is response) per row
    for _ in range(args.rows):
        if kind == "step":
            prompt = int(torch.randint(args.prompt // 2, args.prompt + 1, (1,), generator=generator))
            segments.append([(prompt, False), (args.response, True)])
        else:
            segments.append([(args.prompt // args.turns, False), (args.response, True)] * args.turns)
    width = max(sum(n for n, _ in row) for row in segments)
    ids = torch.randint(1, vocab, (args.rows, width), generator=generator)
    mask, response = torch.zeros(args.rows, width, dtype=torch.long), torch.zeros(args.rows, width)
    for b, row in enumerate(segments):
        start = 0
        for n, is_response in row:
            mask[b, start : start + n] = 1
            response[b, start : start + n] = float(is_response)
            start += n
    return ids * mask, mask, response


def run(model: nn.Module, batch: tuple, scored: torch.Tensor | None, train: bool) -> float:
    ids, mask, _ = batch
    start = time.perf_counter()
    with torch.set_grad_enabled(train):
        logprobs, entropy = token_logprobs(model, ids, mask, 1.0, with_entropy=train, scored=scored)
        if train:
            (logprobs.sum() + entropy.sum()).backward()
    return time.perf_counter() - start


def measure(model: nn.Module, batch: tuple, repeats: int) -> dict[str, dict[str, float]]:
    heads = model.get_output_embeddings()
    positions: list[int] = []
    hook = heads.register_forward_hook(lambda m, a, out: positions.append(out.shape[:-1].numel()))
    variants = {"every_position": (EveryPosition(model), None), "real_tokens": (model, None)}
    variants["response"] = (model, batch[2])
    times: dict[str, dict[str, list[float]]] = {name: {"score": [], "train": []} for name in variants}
    counted: dict[str, int] = {}
    for _ in range(repeats):
        for name, (runner, scored) in variants.items():
            for phase in ("score", "train"):
                positions.clear()
                times[name][phase].append(run(runner, batch, scored, phase == "train"))
                counted[name] = positions[0]
                model.zero_grad(set_to_none=True)
    hook.remove()
    vocab = model.config.vocab_size
    return {
        name: {
            "score_s": statistics.median(times[name]["score"]),
            "train_s": statistics.median(times[name]["train"]),
            "head_positions": counted[name],
            "logits_mb": counted[name] * vocab * 4 / 2**20,
        }
        for name in variants
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=96)
    parser.add_argument("--response", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**(QWEN2_HALF_B | {"num_hidden_layers": args.layers})))
    print(f"load {os.getloadavg()[0]:.1f}; {torch.get_num_threads()} threads; layers {args.layers}")
    ratios = {}
    for kind in ("step", "traj"):
        batch = layout(kind, args, model.config.vocab_size)
        results = measure(model, batch, args.repeats)
        print(f"\n{kind}: {args.rows} rows of {batch[0].shape[1]} columns, {int(batch[1].sum())} real tokens")
        print("| variant | head positions | logits MB (fp32) | score s | train s | score x | train x |")
        print("|---|---|---|---|---|---|---|")
        base = results["every_position"]
        for name, r in results.items():
            print(
                f"| {name} | {r['head_positions']} | {r['logits_mb']:.0f} | {r['score_s']:.3f} | {r['train_s']:.3f}"
                f" | {base['score_s'] / r['score_s']:.2f} | {base['train_s'] / r['train_s']:.2f} |"
            )
        best = results["response"]
        ratios[f"{kind}_score_ratio"] = base["score_s"] / best["score_s"]
        ratios[f"{kind}_train_ratio"] = base["train_s"] / best["train_s"]
        ratios[f"{kind}_positions_ratio"] = base["head_positions"] / best["head_positions"]
    print(f"\nload {os.getloadavg()[0]:.1f}")
    print(result_line("scored_logits", ratios))


if __name__ == "__main__":
    main()
