"""Peak activation memory of one training forward + backward with and without gradient
checkpointing (`disable_gradient_checkpointing: false`), on the same batch, through the strategy.

Method. Each measurement runs in a fresh Python process (`--child`), so no allocator cache or
earlier peak carries over. The child builds a Qwen2-style model from a fixed seed (`--layers`,
`--hidden`; no download), the `torch` training strategy with or without checkpointing
(`build_train_strategy`), and a batch of `--rows` x `--seq_len` tokens. It runs one small
backward first, so gradients, the allocator and the thread pools exist before the measurement.
Then:
- on CPU: peak RSS (`resource.getrusage(RUSAGE_SELF).ru_maxrss`, the kernel's high-water mark)
  minus the RSS just before the big forward + backward (psutil). That is what the activations
  (and transient buffers: logits, attention, autograd temporaries) added. torch's CPU tensors live
  in malloc'd memory that tracemalloc does not see, and large ones are mmap'd and handed back when
  freed, so RSS follows them.
- on CUDA (when available): `torch.cuda.max_memory_allocated()` minus the allocated memory before.
The variants alternate over `--repeats`; each figure is the median. The step time is the wall time
of that forward + backward (checkpointing recomputes each layer's forward in backward).

    python benchmarks/training/grad_checkpointing.py [--layers 8 --hidden 512 --rows 4 --seq_len 512 --repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time


def child(args: argparse.Namespace) -> dict:
    import psutil
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from roll.configs.worker import TrainingArgs
    from roll.distributed.strategies.registry import build_train_strategy

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64,
        num_key_value_heads=max(1, args.hidden // 256),
        max_position_embeddings=args.seq_len,
    )
    model = Qwen2ForCausalLM(config)
    model.config._attn_implementation = "sdpa"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    strategy = build_train_strategy(
        model,
        TrainingArgs(per_device_train_batch_size=args.rows),
        total_steps=1,
        metric_prefix="actor",
        device=device,
        gradient_checkpointing=args.checkpointing,
    )
    module = strategy.train_module
    ids = torch.randint(1, args.vocab, (args.rows, args.seq_len), generator=torch.Generator().manual_seed(1)).to(device)

    def forward_backward(batch: torch.Tensor) -> None:
        module(input_ids=batch, attention_mask=torch.ones_like(batch), labels=batch).loss.backward()

    forward_backward(ids[:1, :8])  # gradients, allocator and thread pools exist from here on
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = psutil.Process().memory_info().rss
    start = time.perf_counter()
    forward_backward(ids)
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return {
        "seconds": time.perf_counter() - start,
        "peak_mib": (peak - before) / 2**20,
        "device": device,
        "method": "cuda max_memory_allocated" if device == "cuda" else "ru_maxrss - rss before",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--seq_len", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--checkpointing", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    passed = [a for a in sys.argv[1:] if a not in ("--child", "--checkpointing")]
    runs: dict[bool, list[dict]] = {False: [], True: []}
    for _ in range(args.repeats):
        for checkpointing in (False, True):
            command = [sys.executable, __file__, "--child", *passed, *(["--checkpointing"] if checkpointing else [])]
            out = subprocess.run(command, capture_output=True, text=True, check=True, env=os.environ)
            runs[checkpointing].append(json.loads(out.stdout.strip().splitlines()[-1]))
    load = os.getloadavg()[0]
    print(
        f"model: Qwen2-style, {args.layers} layers, hidden {args.hidden}; batch {args.rows} x {args.seq_len} tokens; "
        f"device {runs[False][0]['device']} ({runs[False][0]['method']}); load at end {load:.1f}"
    )
    print("| checkpointing | peak activation MiB (median) | fwd+bwd s (median) | all peaks |")
    print("|---|---|---|---|")
    median = {}
    for checkpointing, results in runs.items():
        peak = statistics.median(r["peak_mib"] for r in results)
        seconds = statistics.median(r["seconds"] for r in results)
        median[checkpointing] = (peak, seconds)
        peaks = ", ".join(f"{r['peak_mib']:.0f}" for r in results)
        print(f"| {'on' if checkpointing else 'off'} | {peak:.0f} | {seconds:.2f} | {peaks} |")
    ratio = median[True][0] / median[False][0]
    slowdown = median[True][1] / median[False][1]
    print(f"RESULT grad_ckpt_peak_memory_ratio={ratio:.2f} grad_ckpt_time_ratio={slowdown:.2f}")


if __name__ == "__main__":
    main()
