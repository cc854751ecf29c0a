"""Multi-turn generation on the `hf` engine with and without per-session KV reuse, side by side.

What is measured: N FrozenLake conversations x T turns, shaped as TrajEnvManager sends them. Turn 0
is the templated instruction and board (72 ids with the tiny FrozenLake tokenizer); every later
turn appends the answer id and the 30 ids that close the turn and show the board again (as after
an invalid move, so every conversation lasts all T turns); one id is generated per turn. All N requests of a
turn go to the engine in one call, as the inference worker batches them. Both engines share one
model and get identical prompts; without reuse each turn re-prefills the whole history, with reuse
only the ids after the cached prefix. The script also checks that both sampled the same tokens.

    python benchmarks/generation/multiturn_generation.py [--sessions 256] [--turns 8] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: import from this checkout
import envs  # noqa: F401  (registers the built-in envs)
from roll.agentic.env.registry import make_env
from roll.agentic.env_manager.chat import ChatFormatter
from roll.core.records import GenerateOutput, GenerateRequest, SamplingParams
from roll.core.seeding import derive_seed
from roll.distributed.strategies.hf.infer import HFInferStrategy
from roll.models.loading import load_causal_lm, load_tokenizer
from roll.models.tiny import build_tiny_model
from roll.pipeline.tiny_model import env_corpus

SAMPLING = SamplingParams(max_new_tokens=1, temperature=1.0)


def build_engines(model_dir: str) -> tuple[HFInferStrategy, HFInferStrategy, ChatFormatter]:
    """(engine without reuse, engine with reuse, chat formatter) over one tiny FrozenLake model."""
    path = build_tiny_model(model_dir, corpus=env_corpus("frozen_lake", {}))
    tokenizer, model = load_tokenizer(path), load_causal_lm(path)
    common = {"pad_token_id": tokenizer.pad_token_id, "eos_token_ids": [tokenizer.eos_token_id]}
    plain = HFInferStrategy(model, max_cached_tokens=0, **common)
    reuse = HFInferStrategy(model, max_cached_tokens=2_000_000, **common)
    return plain, reuse, ChatFormatter(tokenizer, response_prefix="<answer>")


def first_turns(chat: ChatFormatter, sessions: int) -> tuple[list[list[int]], list[str]]:
    """Each conversation's first prompt and the board it keeps seeing (env seed = session index)."""
    env = make_env("frozen_lake", {})
    prompts, boards = [], []
    for s in range(sessions):
        board, info = env.reset(seed=s)
        prompts.append(chat.initial_prompt(info["env_instruction"], board))
        boards.append(board)
    return prompts, boards


def timed_turn(engine: HFInferStrategy, prompts: list[list[int]], turn: int) -> tuple[list[GenerateOutput], float]:
    requests = [
        GenerateRequest(f"s{s}/{turn}", p, SAMPLING, derive_seed(s, turn), session_id=f"s{s}")
        for s, p in enumerate(prompts)
    ]
    start = time.perf_counter()
    outputs = engine.generate_batch(requests)
    return outputs, time.perf_counter() - start


def same_samples(a: list[GenerateOutput], b: list[GenerateOutput]) -> tuple[bool, float]:
    """(identical token ids, max |log-prob difference|)."""
    same = all(x.token_ids == y.token_ids for x, y in zip(a, b))
    diff = max(abs(p - q) for x, y in zip(a, b) for p, q in zip(x.logprobs, y.logprobs))
    return same, diff


def run(sessions: int, turns: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        plain, reuse, chat = build_engines(os.path.join(tmp, "tiny"))
    prompts, boards = first_turns(chat, sessions)
    print(f"{sessions} sessions x {turns} turns, 1 generated id per turn, {torch.get_num_threads()} threads")
    print(
        f"{'turn':>4} {'avg prompt':>10} {'max prompt':>10} {'no reuse s':>10} {'reuse s':>8} "
        f"{'ratio':>6} {'same ids':>8} {'max |dlogp|':>11}"
    )
    totals = [0.0, 0.0]
    for turn in range(turns):
        outs_plain, t_plain = timed_turn(plain, prompts, turn)
        outs_reuse, t_reuse = timed_turn(reuse, prompts, turn)
        same, diff = same_samples(outs_plain, outs_reuse)
        totals[0] += t_plain
        totals[1] += t_reuse
        lengths = [len(p) for p in prompts]
        print(
            f"{turn:>4} {sum(lengths) / len(lengths):>10.1f} {max(lengths):>10} {t_plain:>10.3f} "
            f"{t_reuse:>8.3f} {t_plain / t_reuse:>6.2f} {same!s:>8} {diff:>11.2e}"
        )
        prompts = [p + o.token_ids + chat.next_turn(b, o.token_ids) for p, o, b in zip(prompts, outs_plain, boards)]
    print(f"{'all':>4} {'':>10} {'':>10} {totals[0]:>10.3f} {totals[1]:>8.3f} {totals[0] / totals[1]:>6.2f}")
    for name, engine in (("no reuse", plain), ("reuse", reuse)):
        print(
            f"{name:>8}: prefill_tokens={engine.stats['prefill_tokens']} "
            f"prefix_tokens_reused={engine.stats['prefix_tokens_reused']}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=256)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    run(args.sessions, args.turns)


if __name__ == "__main__":
    main()
