"""The GPU lane (`.ci/run_gpu`): every training strategy and `hf` generation measured on one CUDA
GPU, without Ray (the strategies are driven directly, as a role drives them).

On a random-init Qwen2-shaped model (`--size 0.5b`: Qwen2-0.5B's shape) in bf16:
- training, per strategy (torch, fsdp2, deepspeed ZeRO-2 and ZeRO-3, megatron) and variant
  (plain, gradient checkpointing, LoRA, compile): `--steps` optimizer steps of a causal-LM loss on
  random tokens after one warm-up step -> training tokens/s, MFU and peak memory;
- generation with the `hf` engine -> generated tokens/s.
A variant a strategy cannot run is recorded as "skipped: <why>", never dropped.

MFU = model FLOPs per second / the bf16 matmul peak measured on the same GPU in the same run
(`matmul_peak_flops`), not a datasheet figure; training FLOPs per token = 6 * matmul parameters +
12 * layers * hidden * sequence (PaLM, appendix B), recomputation not counted.

Without CUDA the lane prints "no CUDA device: skipped" for every GPU part and writes nothing.
`--smoke` runs the same code on CPU with a tiny model in float32 for 2 steps (what CI tests,
tests/benchmarks/test_gpu_lane.py); its record goes where `--out` says, never to results/. How
each variant is switched on and how MFU is counted, in full, and every run:
benchmarks/results/gpu_lane.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import importlib.util
import json
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: import from this checkout
from benchmarks.common import REPO

STRATEGIES = ("torch", "fsdp2", "deepspeed_zero2", "deepspeed_zero3", "megatron")
VARIANTS = ("plain", "gradient_checkpointing", "lora", "compile")
SIZES = {  # Qwen2-0.5B's shape; a tiny one for the CPU smoke run
    "0.5b": dict(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    ),
    "tiny": dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    ),
}


@dataclass(frozen=True)
class LaneSettings:
    size: str
    dtype: torch.dtype
    device: torch.device
    batch: int
    seq_len: int
    steps: int
    gen_prompts: int
    gen_tokens: int


# ---- timing and FLOPs ----------------------------------------------------------------------
def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device) -> float:
    """Seconds `fn()` takes, the device's queue drained before and after."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def matmul_peak_flops(device: torch.device, dtype: torch.dtype, n: int = 8192, repeats: int = 10) -> float:
    """Measured peak FLOP/s of an (n, n) @ (n, n) matmul: the best of `repeats` timings."""
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    torch.matmul(a, b)  # warm-up: kernel selection
    best = min(timed(lambda: torch.matmul(a, b), device) for _ in range(repeats))
    return 2 * n**3 / best


def train_flops_per_token(config, seq_len: int) -> float:
    """6 * matmul parameters + 12 * layers * hidden * seq_len (module docstring). The output
    layer is a matmul (vocab * hidden) whether or not it is tied to the embedding; the embedding
    lookup is not."""
    h, layers = config.hidden_size, config.num_hidden_layers
    head_dim = h // config.num_attention_heads
    kv = config.num_key_value_heads * head_dim
    attention = h * h * 2 + 2 * h * kv  # q and o, k and v
    mlp = 3 * h * config.intermediate_size
    matmul_params = layers * (attention + mlp) + config.vocab_size * h
    return 6 * matmul_params + 12 * layers * h * seq_len


def peak_memory_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def reset_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


# ---- model and strategies --------------------------------------------------------------------
def attention_implementation(device: torch.device) -> str:
    """flash_attention_2 on CUDA when flash_attn imports, else sdpa."""
    if device.type == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


def build_model(settings: LaneSettings, seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(**SIZES[settings.size], max_position_embeddings=max(512, settings.seq_len * 2))
    config._attn_implementation = attention_implementation(settings.device)
    return Qwen2ForCausalLM(config).to(settings.dtype)


COMPILED = ("torch", "fsdp2")  # the engines with `torch_compile`


def unsupported(strategy: str, variant: str) -> str | None:
    """Why `strategy` cannot run `variant`, or None when it can (see module docstring)."""
    needs = {"fsdp2": None, "megatron": "megatron.core", "deepspeed_zero2": "deepspeed", "deepspeed_zero3": "deepspeed"}
    module = needs.get(strategy)
    if module and importlib.util.find_spec(module.split(".")[0]) is None:
        return f"{module} is not installed"
    if variant == "lora" and importlib.util.find_spec("peft") is None:
        return "peft is not installed"
    if variant == "compile" and strategy not in COMPILED:
        return "torch_compile is an option of the torch and fsdp2 strategies"
    return None


LORA = {"rank": 16, "alpha": 32, "target": "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"}


def prepare_model(model, strategy: str, variant: str):
    """The HF model with the variant switched on (module docstring), the strategy's options, and
    `build_train_strategy`'s `lora` argument."""
    name, options = strategy, {}
    if strategy.startswith("deepspeed_zero"):
        name, options = (
            "deepspeed",
            {
                "zero_optimization": {"stage": int(strategy[-1])},
                "bf16": {"enabled": next(model.parameters()).dtype == torch.bfloat16},
            },
        )
    if variant == "gradient_checkpointing":
        if strategy == "megatron":
            options["recompute_granularity"] = "full"
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if variant == "compile":
        options["torch_compile"] = True
    return model, name, options, LORA if variant == "lora" else None


def lm_loss(model, micro):
    out = model(input_ids=micro["input_ids"], attention_mask=micro["attention_mask"], labels=micro["input_ids"])
    return out.loss, {}


def random_minibatch(settings: LaneSettings, vocab: int, seed: int):
    from tensordict import TensorDict

    ids = torch.randint(0, vocab, (settings.batch, settings.seq_len), generator=torch.Generator().manual_seed(seed))
    return TensorDict(
        {"input_ids": ids, "attention_mask": torch.ones_like(ids), "response_mask": torch.ones(ids.shape)},
        batch_size=[settings.batch],
    )


def train_one(settings: LaneSettings, strategy: str, variant: str, peak_flops: float) -> dict:
    """Tokens/s, MFU and peak memory of `settings.steps` optimizer steps (one warm-up step first)."""
    from roll.configs.worker import TrainingArgs
    from roll.distributed.strategies.registry import build_train_strategy

    reset_memory(settings.device)
    model, name, options, lora = prepare_model(build_model(settings), strategy, variant)
    config = model.config
    args = TrainingArgs(learning_rate=1e-5, per_device_train_batch_size=settings.batch, max_grad_norm=1.0)
    engine = build_train_strategy(
        model,
        args,
        strategy_name=name,
        strategy_config=options,
        total_steps=1,
        metric_prefix="actor",
        device=settings.device,
        lora=lora,
    )
    engine.train_step(random_minibatch(settings, config.vocab_size, 0), lm_loss)  # warm-up
    norms = []
    seconds = timed(
        lambda: norms.extend(
            engine.train_step(random_minibatch(settings, config.vocab_size, 1 + i), lm_loss)["actor/grad_norm"]  # noqa: F821 - runs before the `del engine` below
            for i in range(settings.steps)
        ),
        settings.device,
    )
    tokens_per_s = settings.batch * settings.seq_len * settings.steps / seconds
    record = {
        "strategy": strategy,
        "variant": variant,
        "tokens_per_s": tokens_per_s,
        "mfu": tokens_per_s * train_flops_per_token(config, settings.seq_len) / peak_flops,
        "peak_memory_gib": peak_memory_gib(settings.device),
        "step_s": seconds / settings.steps,
        "grad_norms_finite": all(math.isfinite(g) for g in norms),
        "fused_adamw": any(group.get("fused") for group in getattr(engine.optimizer, "param_groups", [])),
    }
    del engine, model
    return record


def generate(settings: LaneSettings) -> dict:
    """Generated tokens/s of the `hf` engine: `gen_prompts` 64-token prompts, `gen_tokens` each
    (no stop token: every row runs to the end), sampled."""
    from roll.core.records import GenerateRequest, SamplingParams
    from roll.distributed.strategies.hf.infer import HFInferStrategy

    reset_memory(settings.device)
    model = build_model(settings).to(settings.device)
    engine = HFInferStrategy(model, pad_token_id=0, eos_token_ids=[])
    params = SamplingParams(max_new_tokens=settings.gen_tokens, temperature=1.0)
    prompt = torch.randint(1, model.config.vocab_size, (64,), generator=torch.Generator().manual_seed(0)).tolist()
    requests = [
        GenerateRequest(f"r{i}", prompt[i % 8 :] + prompt[: i % 8], params, seed=i) for i in range(settings.gen_prompts)
    ]
    engine.generate_batch(requests[:1])  # warm-up
    outputs = []
    seconds = timed(lambda: outputs.extend(engine.generate_batch(requests)), settings.device)
    generated = sum(len(out.token_ids) for out in outputs)
    return {
        "prompts": settings.gen_prompts,
        "generated_tokens": generated,
        "tokens_per_s": generated / seconds,
        "peak_memory_gib": peak_memory_gib(settings.device),
    }


# ---- the lane ---------------------------------------------------------------------------------
def lane_settings(
    smoke: bool, steps: int | None, batch: int | None = None, seq_len: int | None = None
) -> LaneSettings | None:
    """The run's settings: the CPU smoke run, the GPU run, or None (no CUDA, no smoke)."""
    if smoke:
        return LaneSettings(
            "tiny",
            torch.float32,
            torch.device("cpu"),
            batch=batch or 2,
            seq_len=seq_len or 16,
            steps=steps or 2,
            gen_prompts=2,
            gen_tokens=4,
        )
    if not torch.cuda.is_available():
        return None
    return LaneSettings(
        "0.5b",
        torch.bfloat16,
        torch.device("cuda", 0),
        batch=batch or 8,
        seq_len=seq_len or 1024,
        steps=steps or 10,
        gen_prompts=32,
        gen_tokens=256,
    )


def run_lane(
    settings: LaneSettings, strategies=STRATEGIES, variants=VARIANTS, save=lambda record: None, generation: bool = True
) -> dict:
    """Every (strategy, variant) and generation; a failure is recorded with its error and the
    lane goes on (the exit status says it failed), a variant a strategy cannot run is skipped.
    `save(record)` runs after each entry, so a lane stopped part way keeps what it measured."""
    device = settings.device
    peak = matmul_peak_flops(device, settings.dtype, n=8192 if device.type == "cuda" else 256)
    record = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({platform.machine()})",
        "date": datetime.date.today().isoformat(),
        "commit": source_commit(),
        "torch": torch.__version__,
        "model": settings.size,
        "transformers": importlib.import_module("transformers").__version__,
        "dtype": str(settings.dtype).removeprefix("torch."),
        "attention": attention_implementation(device),
        "batch": settings.batch,
        "seq_len": settings.seq_len,
        "steps": settings.steps,
        "matmul_peak_tflops": peak / 1e12,
        "training": [],
        "generation": None,
        "failures": [],
    }
    print(f"device: {record['device']}; measured {record['dtype']} matmul peak {peak / 1e12:.1f} TFLOP/s", flush=True)
    for strategy in strategies:
        for variant in variants:
            why = unsupported(strategy, variant)
            if why:
                record["training"].append({"strategy": strategy, "variant": variant, "skipped": why})
                print(f"{strategy:16s} {variant:23s} skipped: {why}", flush=True)
                continue
            try:
                result = train_one(settings, strategy, variant, peak)
            except Exception as error:  # recorded and reported, not hidden: the lane exits 1
                result = {"strategy": strategy, "variant": variant, "error": f"{type(error).__name__}: {error}"[:500]}
                record["failures"].append(f"{strategy}/{variant}")
            record["training"].append(result)
            print(format_training(result), flush=True)
            save(record)
    if not generation:
        return record
    record["generation"] = generate(settings)
    print(f"hf generation: {record['generation']['tokens_per_s']:.1f} tokens/s", flush=True)
    return record


def format_training(result: dict) -> str:
    head = f"{result['strategy']:16s} {result['variant']:23s}"
    if "error" in result:
        return f"{head} FAILED: {result['error']}"
    memory = "" if result["peak_memory_gib"] is None else f", peak {result['peak_memory_gib']:.2f} GiB"
    return f"{head} {result['tokens_per_s']:10.1f} tokens/s, MFU {100 * result['mfu']:.1f}%{memory}"


def new_record_path(results: Path, today: str | None = None, prefix: str = "gpu") -> Path:
    """results/<prefix>-<date>.json, or -2, -3, ... after it: a second run on the same day keeps the
    first's record (the record is rewritten after every entry). The GPU lanes' records all take it."""
    today = today or datetime.date.today().isoformat()
    path, n = results / f"{prefix}-{today}.json", 1
    while path.exists():
        n += 1
        path = results / f"{prefix}-{today}-{n}.json"
    return path


def source_commit() -> str | None:
    """The checkout's commit: git's, else $ROLL_COMMIT (a tree sent to a lent machine travels without
    .git, so the call names it), else None."""
    if os.environ.get("ROLL_COMMIT"):
        return os.environ["ROLL_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model, float32, CPU, 2 steps (CI)")
    parser.add_argument("--steps", type=int, default=None, help="timed optimizer steps per run")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", default=None, help="JSON record path (default results/gpu-<date>.json on a GPU)")
    parser.add_argument("--no_generation", action="store_true", help="training only")
    parser.add_argument("--batch", type=int, default=None, help="sequences per step (GPU default 8)")
    parser.add_argument("--seq_len", type=int, default=None, help="tokens per sequence (GPU default 1024)")
    args = parser.parse_args(argv)
    settings = lane_settings(args.smoke, args.steps, args.batch, args.seq_len)
    if settings is None:
        print(
            "no CUDA device: skipped (training strategies, MFU, generation); nothing written. "
            "`--smoke` runs the same code on CPU with a tiny model"
        )
        return 0
    out = args.out or (None if args.smoke else new_record_path(REPO / "benchmarks" / "results"))

    def save(record: dict) -> None:
        if out:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            Path(out).write_text(json.dumps(record, indent=1) + "\n")

    record = run_lane(settings, args.strategies.split(","), args.variants.split(","), save, not args.no_generation)
    save(record)
    if out:
        print(f"wrote {out}")
    return 1 if record["failures"] else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
