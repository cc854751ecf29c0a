"""The decode lane: the `hf` engine's generation speed against the GPU's floor, in one run.

For each batch size (32 and 256 by default; 64-token prompts, `--new_tokens` sampled tokens, no
stop) it measures, on a random-init Qwen2-0.5B-shaped model in bf16:
- `floor_tokens_per_s`: one decode step of the bare model with transformers' `StaticCache`, softmax
  and `torch.multinomial`, captured as one CUDA graph and replayed 100 times (nothing of ours: the
  model's own sdpa attention; `floor_roll_sdpa_step_ms` is the same step with the engine's
  grouped-query decode attention, for reference);
- `tokens_per_s`: `HFInferStrategy.generate_batch` end to end (prefill, decode, host bookkeeping),
  after one warm-up call of the same shape (which captures its graphs);
- `generate_tokens_per_s`: transformers' `model.generate` (dynamic cache, sampled), the same work;
and `ratio_to_floor` = tokens_per_s / floor_tokens_per_s (`ratio_to_roll_floor`: against the
engine-attention step). Then nano-vllm's benchmark shape: 256
requests with prompts and outputs of random lengths in [100, 1024], tokens/s of the engine.

`--smoke` runs it all on CPU with a tiny model (no graph: the floor is the eager step) for CI;
its record goes where `--out` says, never to results/. Without CUDA and without --smoke it says so
and writes nothing. Figures: benchmarks/README ("Decode lane").
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: import from this checkout
from benchmarks.common import REPO
from benchmarks.gpu import gpu_lane
from benchmarks.gpu.gpu_lane import SIZES, source_commit


def new_record_path(results: Path) -> Path:
    """results/decode-<date>.json, or -2, -3, ... after it: a later run of the day keeps the earlier record."""
    return gpu_lane.new_record_path(results, prefix="decode")


PROMPT_LEN = 64


def build(size: str, device: torch.device, dtype: torch.dtype):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(**SIZES[size], max_position_embeddings=4096)
    config._attn_implementation = "sdpa"
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype)
    return model.eval()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def prompts(n: int, vocab: int, length: int = PROMPT_LEN, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (length,), generator=g).tolist() for _ in range(n)]


@torch.no_grad()
def floor(model, batch: int, device: torch.device, replays: int = 100) -> dict:
    """Seconds of one graph-replayed decode step (eager on CPU) of the bare model."""
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=PROMPT_LEN + replays + 8)
    ids = torch.tensor(prompts(batch, model.config.vocab_size), device=device)
    model(input_ids=ids, past_key_values=cache, use_cache=True)
    step_ids = ids[:, -1:].clone()
    position = torch.full((batch, 1), PROMPT_LEN, device=device)

    def step():
        logits = model(input_ids=step_ids, position_ids=position, past_key_values=cache, use_cache=True).logits
        probs = torch.softmax(logits[:, -1, :].float(), dim=-1)
        step_ids.copy_(torch.multinomial(probs, 1))
        position.add_(1)

    if device.type == "cuda":
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        run, replays = graph.replay, replays - 4
    else:
        run, replays = step, min(replays, 8)
    sync(device)
    start = time.perf_counter()
    for _ in range(replays):
        run()
    sync(device)
    seconds = (time.perf_counter() - start) / replays
    return {"step_ms": 1000 * seconds, "floor_tokens_per_s": batch / seconds}


def engine_run(engine, batch_prompts: list[list[int]], new_tokens: list[int], device) -> tuple[float, int]:
    from roll.core.records import GenerateRequest, SamplingParams

    requests = [
        GenerateRequest(f"r{i}", p, SamplingParams(max_new_tokens=n, temperature=1.0), seed=i)
        for i, (p, n) in enumerate(zip(batch_prompts, new_tokens, strict=True))
    ]
    sync(device)
    start = time.perf_counter()
    outputs = engine.generate_batch(requests)
    sync(device)
    return time.perf_counter() - start, sum(len(o.token_ids) for o in outputs)


@torch.no_grad()
def slot_step_ms(engine, batch: int, device, steps: int = 50) -> float | None:
    """Milliseconds of one decode step of the engine's slots alone (launch + collect, host loop
    excluded), on the slots the last run used: where the engine's time goes, beside the floor."""
    fitting = [s for s in engine.slot_pool.entries if s.size == batch]
    if not fitting:
        return None
    slots = fitting[-1]
    slots.launch(False)
    slots.collect()
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        slots.launch(False)
        slots.collect()
    return 1000 * (time.perf_counter() - start) / steps


@torch.no_grad()
def generate_run(model, batch_prompts: list[list[int]], new_tokens: int, device) -> float:
    ids = torch.tensor(batch_prompts, device=device)
    kwargs = dict(do_sample=True, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)
    model.generate(ids[:, :8], **{**kwargs, "max_new_tokens": 4, "min_new_tokens": 4})  # warm-up
    sync(device)
    start = time.perf_counter()
    model.generate(ids, **kwargs)
    sync(device)
    return time.perf_counter() - start


@contextlib.contextmanager
def attention(model, name: str):
    """The model's attention implementation set to `name` for a while: the engine switched it to
    roll_sdpa, but the floor and `generate` are transformers' own (sdpa)."""
    before = model.config._attn_implementation
    model.config._attn_implementation = name
    try:
        yield
    finally:
        model.config._attn_implementation = before


def measure_batch(model, engine, batch: int, new_tokens: int, device, with_generate: bool) -> dict:
    vocab = model.config.vocab_size
    with attention(model, "sdpa"):
        result = {"batch": batch, "new_tokens": new_tokens, **floor(model, batch, device)}
    ours = floor(model, batch, device)  # the same step with the engine's decode attention
    result["floor_roll_sdpa_step_ms"] = ours["step_ms"]
    batch_prompts = prompts(batch, vocab, seed=batch)
    engine_run(engine, batch_prompts, [new_tokens] * batch, device)  # warm-up: captures this shape's graphs
    seconds, generated = engine_run(engine, batch_prompts, [new_tokens] * batch, device)
    result["tokens_per_s"] = generated / seconds
    result["engine_step_ms"] = slot_step_ms(engine, batch, device)
    result["ratio_to_floor"] = result["tokens_per_s"] / result["floor_tokens_per_s"]
    # against the floor of our own attention (issue 51's goal: >= 0.9 at batch 256)
    result["ratio_to_roll_floor"] = result["tokens_per_s"] / (batch / (ours["step_ms"] / 1000))
    if with_generate:
        with attention(model, "sdpa"):
            seconds = generate_run(model, batch_prompts, new_tokens, device)
        result["generate_tokens_per_s"] = batch * new_tokens / seconds
        result["ratio_to_generate"] = result["tokens_per_s"] / result["generate_tokens_per_s"]
    return result


def profile_engine_run(engine, model, batch: int, new_tokens: int, device, path: Path) -> None:
    """The measured engine run once more under cProfile: where its host time goes (the functions with
    the most own time, then the most time under them), written to `path`."""
    import cProfile
    import io
    import pstats

    batch_prompts = prompts(batch, model.config.vocab_size, seed=batch)
    profiler = cProfile.Profile()
    profiler.enable()
    seconds, _ = engine_run(engine, batch_prompts, [new_tokens] * batch, device)
    profiler.disable()
    text = io.StringIO()
    text.write(f"engine run, batch {batch}, {new_tokens} new tokens: {seconds:.3f} s under cProfile\n")
    for key in ("tottime", "cumulative"):
        pstats.Stats(profiler, stream=text).sort_stats(key).print_stats(30)
    path.write_text(text.getvalue())
    print(f"wrote {path}")


def nano_vllm_shape(model, engine, device, requests: int, low: int, high: int) -> dict:
    """nano-vllm's bench.py shape: random prompt and output lengths in [low, high]."""
    rng = random.Random(0)
    vocab = model.config.vocab_size
    batch_prompts = [[rng.randrange(1, vocab) for _ in range(rng.randint(low, high))] for _ in range(requests)]
    new_tokens = [rng.randint(low, high) for _ in range(requests)]
    seconds, generated = engine_run(engine, batch_prompts, new_tokens, device)
    return {
        "requests": requests,
        "lengths": [low, high],
        "generated_tokens": generated,
        "seconds": seconds,
        "tokens_per_s": generated / seconds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model on CPU (CI)")
    parser.add_argument("--batches", default="32,256")
    parser.add_argument("--new_tokens", type=int, default=256)
    parser.add_argument("--no_generate", action="store_true", help="skip transformers' generate")
    parser.add_argument("--generate_at", default=None, help="batch sizes that run generate too (default: all)")
    parser.add_argument("--no_nano", action="store_true", help="skip nano-vllm's shape")
    parser.add_argument("--out", default=None, help="record path (default results/decode-<date>.json on a GPU)")
    parser.add_argument(
        "--profile_at", default="", help="batch sizes whose engine run is repeated under cProfile (text beside --out)"
    )
    args = parser.parse_args(argv)
    from roll.distributed.strategies.hf.infer import HFInferStrategy

    if args.smoke:
        device, dtype, size, batches, new, nano = torch.device("cpu"), torch.float32, "tiny", [2, 4], 8, (8, 10, 30)
    elif torch.cuda.is_available():
        device, dtype, size = torch.device("cuda", 0), torch.bfloat16, "0.5b"
        batches, new, nano = [int(b) for b in args.batches.split(",")], args.new_tokens, (256, 100, 1024)
    else:
        print("no CUDA device: decode lane skipped, nothing written (`--smoke` runs it on CPU)")
        return 0
    out = args.out or (None if args.smoke else new_record_path(REPO / "benchmarks" / "results"))
    model = build(size, device, dtype)
    engine = HFInferStrategy(model, pad_token_id=0, eos_token_ids=[])
    record = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "date": datetime.date.today().isoformat(),
        "commit": source_commit(),
        "torch": torch.__version__,
        "transformers": importlib.import_module("transformers").__version__,
        "model": size,
        "dtype": str(dtype).removeprefix("torch."),
        "prompt_len": PROMPT_LEN,
        "static_decode": engine.static_decode,
        "batches": [],
    }

    def save() -> None:
        if out:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            Path(out).write_text(json.dumps(record, indent=1) + "\n")

    for batch in batches:
        with_generate = not args.no_generate and (args.generate_at is None or str(batch) in args.generate_at.split(","))
        result = measure_batch(model, engine, batch, new, device, with_generate)
        record["batches"].append(result)
        print(json.dumps(result), flush=True)
        if out and str(batch) in args.profile_at.split(","):
            profile_engine_run(engine, model, batch, new, device, Path(out).with_suffix(f".profile-{batch}.txt"))
        save()
    if not args.no_nano:
        record["nano_vllm_shape"] = nano_vllm_shape(model, engine, device, *nano)
        print(json.dumps(record["nano_vllm_shape"]), flush=True)
    save()
    for r in record["batches"]:
        print(
            f"RESULT decode batch={r['batch']} tokens_per_s={r['tokens_per_s']:.0f} "
            f"floor={r['floor_tokens_per_s']:.0f} ratio_to_floor={r['ratio_to_floor']:.2f}"
            + (f" ratio_to_generate={r['ratio_to_generate']:.2f}" if "ratio_to_generate" in r else "")
        )
    if out:
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
