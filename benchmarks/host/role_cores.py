"""Inference and training at once on a CPU machine: do separate cores help?

What an async run does (`async_generation_ratio: 1`): the engine generates the next step's
trajectories while the trainer trains. Two processes, started together, run for `--seconds`:
- inference: `generate` of `--batch` FrozenLake-sized prompts, 16 new tokens each, on the tiny
  FrozenLake model (tokens/s);
- training: forward, backward and an AdamW step on `--batch` rows of 128 tokens (steps/s);
under each layout:
- `shared`: no pinning, each process with torch's default threads (every core): today's default;
- `shared-1t`: no pinning, threads split between them;
- `pinned`: inference on the first half of the cores, training on the rest
  (`roll.distributed.cpu_affinity.pin_process`), threads equal to cores.
Layouts alternate over `--repeats`, so load from other processes hits each; the table gives
each layout's median, and the ratios to `shared`. The last line is
`RESULT role_cores infer_pinned_over_shared=.. train_pinned_over_shared=.. ...`.

    python benchmarks/host/role_cores.py [--seconds 10 --repeats 3 --batch 16]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: import from this checkout
from benchmarks.common import REPO, load_line
from roll.distributed.cpu_affinity import CpuShare, apply_share, usable_cores


def layouts(cores: tuple[int, ...]) -> dict[str, tuple[CpuShare, CpuShare]]:
    half = max(1, len(cores) // 2)
    return {
        "shared": (CpuShare(None, len(cores)), CpuShare(None, len(cores))),
        "shared-1t": (CpuShare(None, half), CpuShare(None, max(1, len(cores) - half))),
        "pinned": (CpuShare(cores[:half], half), CpuShare(cores[half:] or cores[:1], max(1, len(cores) - half))),
    }


def _inference(model_dir: str, share: CpuShare, batch: int, seconds: float, start, out) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    apply_share(share)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    prompt = torch.randint(10, model.config.vocab_size, (batch, 96), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model.generate(prompt, max_new_tokens=2, do_sample=False, pad_token_id=0)  # warm
        start.wait()
        tokens, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            model.generate(prompt, max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=0)
            tokens += 16 * batch
    out.put(("inference", tokens / (time.perf_counter() - t0)))


def _training(model_dir: str, share: CpuShare, batch: int, seconds: float, start, out) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    apply_share(share)
    model = AutoModelForCausalLM.from_pretrained(model_dir).train()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-5)
    rows = torch.randint(10, model.config.vocab_size, (batch, 128), generator=torch.Generator().manual_seed(1))

    def step():
        model(rows, labels=rows).loss.backward()
        optim.step()
        optim.zero_grad()

    step()  # warm
    start.wait()
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        step()
        steps += 1
    out.put(("training", steps / (time.perf_counter() - t0)))


def run_layout(model_dir: str, shares: tuple[CpuShare, CpuShare], batch: int, seconds: float) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(3), ctx.Queue()
    procs = [
        ctx.Process(target=fn, args=(model_dir, share, batch, seconds, start, out))
        for fn, share in zip((_inference, _training), shares)
    ]
    for p in procs:
        p.start()
    start.wait()
    results = dict(out.get() for _ in procs)
    for p in procs:
        p.join()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    cores = usable_cores()
    print(load_line(len(cores)))
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in layouts(cores)}
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "roll.pipeline.tiny_model",
                "--preset",
                "frozen_lake",
                "--output_dir",
                f"{tmp}/model",
            ],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
        for _ in range(args.repeats):
            for name, shares in layouts(cores).items():
                runs[name].append(run_layout(f"{tmp}/model", shares, args.batch, args.seconds))
    med = {
        name: {k: statistics.median(r[k] for r in rs) for k in ("inference", "training")} for name, rs in runs.items()
    }
    base = med["shared"]
    print(f"{'layout':12}{'infer tok/s':>13}{'train steps/s':>15}{'infer/shared':>14}{'train/shared':>14}")
    for name, m in med.items():
        print(
            f"{name:12}{m['inference']:13.0f}{m['training']:15.2f}{m['inference'] / base['inference']:13.2f}x"
            f"{m['training'] / base['training']:13.2f}x"
        )
    print(
        "RESULT role_cores "
        + " ".join(
            f"{what}_{name.replace('-', '_')}_over_shared={med[name][key] / base[key]:.2f}"
            for name in med
            if name != "shared"
            for what, key in (("infer", "inference"), ("train", "training"))
        )
    )


if __name__ == "__main__":
    main()
