"""The floor of each phase of a pipeline step, measured on the device the step ran on, and how far
the step is above it (issue 51: "the 0.5B-shaped step near the sum of its floors").

Per phase, from the run's own metrics and three facts measured in the same lane run
(`device_facts`):
- rollout: the step's generated tokens over the engine's decode floor at the rollout's batch
  (one graph-replayed decode step of the bare model, benchmarks/gpu/decode_lane.py's `floor`);
- score: a forward pass (2 FLOPs a matmul parameter a token) over the tokens scored, at 50% of
  the device's measured bf16 matmul peak;
- train: forward and backward (benchmarks/gpu/gpu_lane.py's `train_flops_per_token`) over the tokens
  trained, `ppo_epochs` times, at 50% of that peak;
- sync: the model's bytes over the device's measured copy bandwidth (the IPC sync copies them
  once, device to device).

`phase_floor_ratio[phase]` = measured seconds / floor seconds; `step` = the step's seconds over
the sum of the floors. Pure arithmetic here (`phase_floors`); `device_facts` runs on the device.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: import from this checkout

MFU_TARGET = 0.5
PHASES = ("rollout", "score", "train", "sync")


def matmul_params(config) -> int:
    """Parameters that enter a matmul per token (the output layer included, the embedding not)."""
    h, layers = config.hidden_size, config.num_hidden_layers
    kv = config.num_key_value_heads * (h // config.num_attention_heads)
    return layers * (2 * h * h + 2 * h * kv + 3 * h * config.intermediate_size) + config.vocab_size * h


def phase_floors(steps: list[dict], facts: dict, ppo_epochs: int = 1) -> dict:
    """Mean measured seconds, floor seconds and their ratio per phase over `steps` (metrics.jsonl
    rows). `facts`: `matmul_params`, `weight_bytes`, `peak_flops`, `copy_bytes_per_s`,
    `decode_tokens_per_s` (the floor at the rollout's batch)."""
    if not steps:
        return {}

    def mean(key: str) -> float:
        return sum(r.get(key, 0.0) for r in steps) / len(steps)

    tokens = mean("train/tokens_per_episode") * mean("rollout/kept_trajectories")
    flops_s = MFU_TARGET * facts["peak_flops"]
    floors = {
        "rollout": mean("rollout/generated_tokens") / facts["decode_tokens_per_s"],
        "score": 2 * facts["matmul_params"] * tokens / flops_s,
        "train": 6 * facts["matmul_params"] * tokens * ppo_epochs / flops_s,
        "sync": facts["weight_bytes"] / facts["copy_bytes_per_s"],
    }
    measured = {phase: mean(f"time/{phase}_s") for phase in PHASES}
    ratio = {phase: measured[phase] / floors[phase] for phase in PHASES if floors[phase] > 0}
    ratio["step"] = mean("time/step_s") / sum(floors.values())
    return {
        "floor_s": {k: round(v, 6) for k, v in floors.items()},
        "measured_s": {k: round(v, 6) for k, v in measured.items()},
        "phase_floor_ratio": {k: round(v, 3) for k, v in ratio.items()},
    }


def device_facts(model_dir: str, batch: int, dtype: str, device: str) -> dict:
    """What `phase_floors` needs, measured on `device` with the model of `model_dir`."""
    import torch
    from transformers import AutoModelForCausalLM

    from benchmarks.gpu import decode_lane, gpu_lane

    dev = torch.device(device)
    torch_dtype = {"bf16": torch.bfloat16, "float32": torch.float32}[dtype]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype).to(dev).eval()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    decode = decode_lane.floor(model, batch, dev)
    peak = gpu_lane.matmul_peak_flops(dev, torch_dtype, n=8192 if dev.type == "cuda" else 256)
    return {
        "matmul_params": matmul_params(model.config),
        "weight_bytes": weight_bytes,
        "peak_flops": peak,
        "copy_bytes_per_s": copy_bandwidth(dev),
        "decode_tokens_per_s": decode["floor_tokens_per_s"],
        "decode_batch": batch,
    }


def copy_bandwidth(device, nbytes: int = 256 * 2**20, repeats: int = 5) -> float:
    """Bytes/s of the best of `repeats` copies of `nbytes` from one buffer to another on `device`."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        dst.copy_(src)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return nbytes / best
