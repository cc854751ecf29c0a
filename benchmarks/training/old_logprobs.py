"""PPO's old log-probs in a pass of their own (the score phase) vs taken in the actor's training
call (`roll.distributed.workers.old_logprobs`, ROLL's `enable_old_logprobs_recompute: false`,
the default).

Two measurements, both with the two modes side by side, alternating:
- the pipeline (default): the README's FrozenLake example with the tiny model, validation and
  checkpoints off, in two shapes: `readme`, its own mini-batches of 512 rows (a step of about 750
  rows: the training call still scores the third outside the first mini-batch), and
  `one_minibatch`, the whole step in one mini-batch of 1,024 rows (as ROLL's examples are set up;
  no pass at all). `--rounds` rounds; each run takes `--steps` steps, of which steps 1-2
  (warm-up) are left out. `--micro` uses a model too small to cost anything (hidden 16, one layer).
- `--worker`: one `ActorWorker` in this process on a model of Qwen2-0.5B's width and vocabulary
  (`--layers` of its 24 layers, random init, float32 on CPU), where a forward pass costs what it
  does on a real model: `--rows` step-wise rows (a 48-96-token prompt and a 16-token action), one
  PPO epoch, in one mini-batch and in two. The pass mode's time is its `compute_logprobs` plus its
  `train`; each figure is the median of `--repeats`.

    python benchmarks/training/old_logprobs.py [--steps 12 --rounds 2 --micro]
    python benchmarks/training/old_logprobs.py --worker [--layers 2 --rows 16 --repeats 5]

The last lines are `RESULT old_logprobs shape=<shape> score_plus_train_mean_ratio=<pass / in
training> step_mean_ratio=<..>` (pipeline) or `RESULT old_logprobs_worker shape=<shape>
ratio=<pass / in training>`, one per shape.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: import from this checkout
from tensordict import TensorDict

from benchmarks.common import REPO, load_span
from benchmarks.gpu.gpu_e2e import QWEN2_HALF_B
from benchmarks.host.gc_pauses import MICRO, run_pipeline

BASE = ["save_steps=0", "eval_steps=1000"]
SHAPES = {
    "readme": [],
    "one_minibatch": [
        "actor_train.training_args.per_device_train_batch_size=128",
        "actor_train.training_args.gradient_accumulation_steps=8",
    ],
}
MODES = {"pass": ["enable_old_logprobs_recompute=true"], "in_training": ["enable_old_logprobs_recompute=false"]}


def summary(times: dict[str, list[float]]) -> dict[str, float]:
    both = [s + t for s, t in zip(times["score"], times["train"], strict=True)]
    return {
        "score_mean": statistics.mean(times["score"]),
        "train_mean": statistics.mean(times["train"]),
        "score_plus_train_mean": statistics.mean(both),
        "step_mean": statistics.mean(times["step"]),
        "step_median": statistics.median(times["step"]),
    }


WORKER_SHAPES = {"one_minibatch": 1, "two_minibatches": 2}
"""--worker: how many mini-batches the rows are split into."""


def worker_batch(rows: int, vocab: int) -> TensorDict:
    """`rows` distinct step-wise rows: a prompt of 48-96 tokens then a 16-token action, right-padded;
    advantages +-1 by row, the engine's log-probs a constant."""
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(48, 97, (rows,), generator=generator)
    width = int(prompts.max()) + 16
    positions = torch.arange(width)
    attention = (positions < (prompts + 16)[:, None]).long()
    response = ((positions >= prompts[:, None]) & (attention > 0)).float()
    sign = torch.where(torch.arange(rows) % 2 == 0, 1.0, -1.0)[:, None]
    return TensorDict(
        {
            "input_ids": torch.randint(1, vocab, (rows, width), generator=generator) * attention,
            "attention_mask": attention,
            "response_mask": response,
            "advantages": sign * response,
            "infer_logprobs": -3.0 * response,
        },
        batch_size=[rows],
    )


def worker_main(args: argparse.Namespace) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from roll.algorithms.actor_loss import PolicyLossOptions
    from roll.configs.worker import TrainingArgs
    from roll.distributed.workers.actor import ActorWorker

    load_before = os.getloadavg()[0]
    config = Qwen2Config(**dict(QWEN2_HALF_B, num_hidden_layers=args.layers))
    loss = PolicyLossOptions(entropy_coef=0.01)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        Qwen2ForCausalLM(config).save_pretrained(tmp)
        batch = worker_batch(args.rows, config.vocab_size)
        for shape, splits in WORKER_SHAPES.items():
            micro = args.rows // splits // 2  # two micro-batches a mini-batch
            training = TrainingArgs(
                learning_rate=1e-6, per_device_train_batch_size=micro, gradient_accumulation_steps=2
            )
            actors = {mode: ActorWorker(tmp, training, total_train_steps=1000, seed=0) for mode in MODES}
            times: dict[str, list[float]] = {mode: [] for mode in MODES}
            for repeat in range(args.repeats + 1):  # the first is a warm-up
                for mode, actor in actors.items():
                    start = time.perf_counter()
                    given = batch.clone()
                    if mode == "pass":
                        given["old_logprobs"] = actor.compute_logprobs(given, 1.0)
                    actor.train(given, loss, ppo_epochs=1, step=repeat)
                    if repeat:
                        times[mode].append(time.perf_counter() - start)
            results[shape] = {mode: statistics.median(values) for mode, values in times.items()}
    load = load_span(load_before)
    print(f"\n{args.layers} of Qwen2-0.5B's layers, float32, {args.rows} rows, median of {args.repeats}; {load}")
    print("| mini-batches | pass + train (s) | train taking them (s) | ratio |")
    print("|---|---|---|---|")
    for shape, row in results.items():
        print(f"| {shape} | {row['pass']:.3f} | {row['in_training']:.3f} | {row['pass'] / row['in_training']:.2f} |")
    for shape, row in results.items():
        print(f"RESULT old_logprobs_worker shape={shape} ratio={row['pass'] / row['in_training']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--micro", action="store_true", help="the hidden-16 one-layer model instead of the tiny one")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="which of " + ", ".join(SHAPES))
    parser.add_argument("--worker", action="store_true", help="one actor in this process, Qwen2-0.5B's width")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    if args.worker:
        worker_main(args)
        return
    from roll.pipeline.tiny_model import main as build_model

    shapes = args.shapes.split(",")
    load_before = os.getloadavg()[0]
    merged = {(shape, mode): {} for shape in shapes for mode in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(["--preset", "frozen_lake", "--output_dir", f"{tmp}/model", *(MICRO if args.micro else [])])
        for round_ in range(args.rounds):
            for shape in shapes:
                for mode, keys in MODES.items():
                    out = Path(tmp) / f"{shape}-{mode}-{round_}"
                    times = run_pipeline(model, out, args.steps, {}, BASE + SHAPES[shape] + keys)
                    for key, values in times.items():
                        merged[shape, mode].setdefault(key, []).extend(values)
                    step = statistics.mean(times["step"])
                    print(f"round {round_ + 1} {shape} {mode}: step mean {step:.3f} s", flush=True)
    rows = {key: summary(times) for key, times in merged.items()}
    columns = list(next(iter(rows.values())))
    model_name = "micro (hidden 16, 1 layer)" if args.micro else "tiny"
    load = load_span(load_before)
    print(f"\n{model_name}; {args.rounds} round(s) of {args.steps} steps (steps 3+), {load}; {os.cpu_count()} cores")
    print("| shape | old log-probs | " + " | ".join(columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for (shape, mode), row in rows.items():
        print(f"| {shape} | {mode} | " + " | ".join(f"{row[c]:.3f}" for c in columns) + " |")
    for shape in shapes:
        before, after = rows[shape, "pass"], rows[shape, "in_training"]
        ratios = {k: before[k] / after[k] for k in ("score_plus_train_mean", "step_mean")}
        print(f"RESULT old_logprobs shape={shape} " + " ".join(f"{k}_ratio={v:.2f}" for k, v in ratios.items()))


if __name__ == "__main__":
    main()
