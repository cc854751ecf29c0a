"""The `hf` engine on CPU with the tiny model: static decode slots against the dynamic-cache loop.

The same requests (random prompts of 40-120 ids, one seed each, sampled) go through two engines on
one model, taking turns within each repeat so that load from other processes hits both; a mode's
time is the best of `--repeats`. Two response lengths: `--max_new_tokens` (decode-heavy) and 1
(the FrozenLake example's one-token answers: prefill only). Both modes draw the same uniforms, so
their tokens agree (the `same ids` column; up to float round-off).

    python benchmarks/generation/static_decode_cpu.py [--rows 32,128 --max_new_tokens 32 --repeats 5 --threads 1]

Last line: `RESULT static_vs_dynamic=<min ratio of tokens/s over the cases>` (>= 1.0: no slower).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: import from this checkout
from roll.core.records import GenerateRequest, SamplingParams
from roll.distributed.strategies.hf.infer import HFInferStrategy
from roll.models.loading import load_causal_lm, load_tokenizer
from roll.models.tiny import build_tiny_model


def requests(rows: int, max_new: int, vocab: int) -> list[GenerateRequest]:
    rng = random.Random(rows)
    return [
        GenerateRequest(
            f"r{i}",
            [rng.randrange(3, vocab) for _ in range(rng.randint(40, 120))],
            SamplingParams(max_new_tokens=max_new, temperature=1.0),
            seed=i,
        )
        for i in range(rows)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="32,128")
    parser.add_argument("--max_new_tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_model(f"{tmp}/m", corpus=["You are P."], seed=0)
        tok, model = load_tokenizer(path), load_causal_lm(path)
    make = lambda static: HFInferStrategy(  # noqa: E731
        model, pad_token_id=tok.pad_token_id, eos_token_ids=[], static_decode=static
    )
    engines = {"slots": make(True), "dynamic": make(False)}
    print(f"{'rows':>5} {'new':>4} {'slots tok/s':>12} {'dynamic tok/s':>14} {'ratio':>6} same ids")
    ratios = []
    for rows in (int(r) for r in args.rows.split(",")):
        for max_new in (args.max_new_tokens, 1):
            reqs = requests(rows, max_new, model.config.vocab_size)
            best, outs = {name: float("inf") for name in engines}, {}
            for _ in range(args.repeats):
                for name, engine in engines.items():
                    start = time.perf_counter()
                    outs[name] = engine.generate_batch(reqs)
                    best[name] = min(best[name], time.perf_counter() - start)
            same = all(a.token_ids == b.token_ids for a, b in zip(outs["slots"], outs["dynamic"], strict=True))
            speed = {name: rows * max_new / best[name] for name in engines}
            ratios.append(speed["slots"] / speed["dynamic"])
            print(f"{rows:5d} {max_new:4d} {speed['slots']:12.0f} {speed['dynamic']:14.0f} {ratios[-1]:6.2f} {same}")
    print(f"RESULT static_vs_dynamic={min(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
