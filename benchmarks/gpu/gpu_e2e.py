"""The GPU end-to-end lane (`.ci/run_gpu_e2e`): the real pipeline (CLI, Ray, workers, env managers,
weight sync, validation, checkpoints) on one CUDA GPU, every role colocated on GPU 0, taking turns.

Parts (`--parts`, default a,b,c), each a run of examples/start_agentic_pipeline.py in its own process,
stopped by SIGTERM at its `--budget_s` (the run stops cleanly; what it logged is still summarised):
- a: the README's FrozenLake example (the tiny model) with actor_train, actor_infer and a reference
  on GPU 0 (`use_kl_loss` with a small `kl_loss_coef`, so the reference runs every step), `--steps_a`
  steps: time to val success >= 0.9, seconds a step and their split.
- b: a Qwen2-0.5B-shaped random-init model (bf16, Qwen2's vocabulary size, the tiny tokenizer) on
  FrozenLake, `--steps_b` steps of 32 trajectories, 16 tokens an action: per-phase seconds,
  peak GPU memory per role, weight-sync seconds and path, generated tokens/s through the pipeline
  beside the `hf` engine alone on the same shape.
- c: part a's last checkpoint loaded with `from_pretrained` on CPU, then the run resumed from it on
  the GPU for `--steps_c` more steps.
- a_cpu (only when named): part a with every role on CPU, the side-by-side figure.
The record (benchmarks/results/gpu-e2e-<date>.json on CUDA; a copy in `--out` with each part's log,
metrics.jsonl and placement.json) is rewritten after every part. `--smoke` runs the same parts on
CPU (`+profile=cpu_smoke`, tiny models, 2 steps); its record goes only to `--out`, marked smoke.
Without CUDA and without `--smoke` it prints "no CUDA device: skipped" and writes nothing.
What each field means: docs/gpu.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: import from this checkout
from benchmarks.common import REPO
from benchmarks.gpu.gpu_e2e_summary import read_metrics, resume_check, summarize_run
from benchmarks.reliability import spy

PARTS = ("a", "b", "c", "a_cpu")
DEFAULT_BUDGETS_S = {"a": 180.0, "b": 120.0, "c": 80.0, "a_cpu": 180.0}
"""Seconds each part may run, startup included: a, b and c with the models' builds fit in 7 minutes
(.ci/run_gpu_session gives the lane 420 s)."""
_TERMINATED: list[int] = []  # the lane got SIGTERM: the running part is stopped, the record saved
SMOKE_STEPS = 2
SMOKE_BUDGET_S = 900.0
B_TOKENS_PER_ACTION = 16  # part b: a random model never stops early, so every action is this long
CLI = ["examples/start_agentic_pipeline.py", "--config_path", "frozen_lake", "--config_name", "agent_val_frozen_lake"]
REFERENCE = ["use_kl_loss=true", "kl_loss_coef=0.001", "+reference.strategy_args.strategy_name=hf_infer"]
GPU_MICRO_BATCHES = [
    "actor_train.training_args.per_device_train_batch_size=512",
    "actor_train.training_args.gradient_accumulation_steps=1",
    "actor_train.infer_batch_size=512",
    "+reference.infer_batch_size=512",
]
"""Parts a and c outside smoke: the example's PPO mini-batch of 512 rows in one micro-batch (its 128-row
micro-batches suit a CPU; a GPU takes 512 rows at once), log-prob passes alike; --a_extra comes after."""
QWEN2_HALF_B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    tie_word_embeddings=True,
)
QWEN2_SMOKE = dict(
    QWEN2_HALF_B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=1024
)


@dataclass
class Lane:
    smoke: bool
    work: Path
    """Where the runs write (models, output dirs); --work, default output/gpu_e2e."""
    out: Path | None
    steps: dict[str, int]
    budgets_s: dict[str, float]
    record_path: Path | None
    record: dict = field(default_factory=dict)
    a_extra: list[str] = field(default_factory=list)
    """Hydra overrides added to parts a and c (--a_extra), e.g. micro-batches sized for the GPU."""
    profile_calls: str = ""
    """ROLL_PROFILE_CALLS for every part's workers (roll/utils/call_profile.py); reports in --out."""
    spy: tuple[int, float] | None = None
    """--spy STEP:SECONDS: py-spy stacks of every process of parts a and a_cpu (benchmarks/reliability/spy.py)."""

    def devices(self, cpu: bool = False) -> list[str]:
        """device_mapping overrides: every role on GPU 0, or every role on CPU (null)."""
        where = "null" if self.smoke or cpu else "[0]"
        return [f"actor_train.device_mapping={where}", f"actor_infer.device_mapping={where}"] + [
            f"+reference.device_mapping={where}"
        ]

    def profile(self) -> list[str]:
        return ["+profile=cpu_smoke"] if self.smoke else []

    def save(self) -> None:
        """The record to results/ (CUDA) and to --out, rewritten whole each time."""
        text = json.dumps(self.record, indent=1) + "\n"
        for path in (self.record_path, self.out / "record.json" if self.out else None):
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)


# ---- running one pipeline -------------------------------------------------------------------
def run_pipeline(
    name: str, overrides: list[str], output_dir: Path, budget_s: float, lane: Lane, fresh: bool = True
) -> dict:
    """One CLI run in its own process group, its log in output_dir/../<name>.log; the arrival time of
    each metrics.jsonl line is noted while it runs (wall seconds since launch). At `budget_s` it gets
    SIGTERM (the CLI stops cleanly), 60 s later SIGKILL; when the lane itself gets SIGTERM, the run
    gets it at once and 20 s. `fresh`: output_dir is emptied first (a run resumed in it keeps it; the
    steps already logged there are not noted as arriving). Returns status, rc, wall_s, arrivals."""
    if fresh and output_dir.exists():
        shutil.rmtree(output_dir)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    log_path = output_dir.parent / f"{name}.log"
    cmd = [sys.executable, *CLI, f"output_dir={output_dir}", *overrides]
    arrivals: dict = {}
    _note_arrivals(output_dir / "metrics.jsonl", arrivals, None)  # logged before this run: None
    start, status = time.monotonic(), "ok"
    with open(log_path, "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        env = dict(os.environ)
        if lane.profile_calls:
            profiles = (lane.out or output_dir.parent) / f"profiles-{name}"
            env |= {"ROLL_PROFILE_CALLS": lane.profile_calls, "ROLL_PROFILE_DIR": str(profiles.resolve())}
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        spy_at = lane.spy[0] if lane.spy and name.startswith("a") else None
        while proc.poll() is None:
            time.sleep(0.2)
            _note_arrivals(output_dir / "metrics.jsonl", arrivals, time.monotonic() - start)
            if spy_at is not None and arrivals.get(spy_at) is not None:
                spy.record(proc.pid, lane.spy[1], (lane.out or output_dir.parent) / f"spy-{name}")
                spy_at = None
            if time.monotonic() - start > budget_s and status == "ok":
                status, stopped = "stopped_at_budget", time.monotonic()
                proc.send_signal(signal.SIGTERM)
            if _TERMINATED and status != "interrupted":
                status, stopped = "interrupted", time.monotonic() - 40  # 20 s to stop, not 60
                proc.send_signal(signal.SIGTERM)
            if status != "ok" and time.monotonic() - stopped > 60:
                os.killpg(proc.pid, signal.SIGKILL)  # the group this lane started for the run
                proc.wait()
    _note_arrivals(output_dir / "metrics.jsonl", arrivals, time.monotonic() - start)
    if status == "ok" and proc.returncode != 0:
        status = "failed"
    _copy_outputs(name, output_dir, log_path, lane.out)
    arrivals = {step: at for step, at in arrivals.items() if at is not None}
    return {"status": status, "rc": proc.returncode, "wall_s": time.monotonic() - start, "arrivals": arrivals}


def _note_arrivals(metrics: Path, arrivals: dict, now: float | None) -> None:
    if not metrics.exists():
        return
    for line in metrics.read_text().splitlines():
        if line.strip():
            try:
                arrivals.setdefault(int(json.loads(line)["step"]), now)
            except (ValueError, KeyError):  # a line being written
                continue


def _copy_outputs(name: str, output_dir: Path, log_path: Path, out: Path | None) -> None:
    if out is None:
        return
    dest = out / name
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(log_path, dest / "run.log")
    for file in ("metrics.jsonl", "placement.json"):
        if (output_dir / file).exists():
            shutil.copy(output_dir / file, dest / file)


# ---- models ---------------------------------------------------------------------------------
def tiny_model(lane: Lane) -> Path:
    """The README example's model: `python -m roll.pipeline.tiny_model --preset frozen_lake`."""
    path = lane.work / "models" / "tiny-frozen-lake"
    if not (path / "config.json").exists():
        from roll.pipeline.tiny_model import main as build

        build(["--preset", "frozen_lake", "--output_dir", str(path)])
    return path


def qwen2_shaped_model(lane: Lane) -> Path:
    """Qwen2-0.5B's shape (QWEN2_HALF_B; a small one in smoke mode), random init (seed 0), bf16
    (float32 in smoke), saved as an HF dir with the tiny model's tokenizer. Ids past the tokenizer's
    vocabulary decode to nothing, so the env sees an invalid action (a format penalty)."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    path = lane.work / "models" / ("qwen2-smoke-shape" if lane.smoke else "qwen2-0.5b-shape")
    if (path / "config.json").exists():
        return path
    tokenizer = AutoTokenizer.from_pretrained(tiny_model(lane))
    torch.manual_seed(0)
    config = Qwen2Config(
        **(QWEN2_SMOKE if lane.smoke else QWEN2_HALF_B),
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = Qwen2ForCausalLM(config).to(torch.float32 if lane.smoke else torch.bfloat16)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


# ---- the parts ------------------------------------------------------------------------------
def a_overrides(lane: Lane, cpu: bool = False) -> list[str]:
    """The README example with a reference role, every role on GPU 0 (on CPU: `cpu`, or smoke)."""
    steps = lane.steps["a"]
    # every 10 steps: a run stopped at its budget still leaves one for part c (an H200 run stopped at step
    # 45 with a checkpoint every 50 steps left none); the tiny model saves in well under a second
    save = steps if lane.smoke else min(10, steps)
    overrides = [f"pretrain={tiny_model(lane)}", f"max_steps={steps}", f"save_steps={save}", *REFERENCE]
    overrides += ([] if lane.smoke else GPU_MICRO_BATCHES) + lane.a_extra
    return overrides + lane.devices(cpu) + lane.profile() + (["eval_steps=1"] if lane.smoke else [])


def part_a(lane: Lane, cpu: bool = False) -> dict:
    name = "a_cpu" if cpu else "a"
    overrides = a_overrides(lane, cpu)
    run = run_pipeline(name, overrides, lane.work / name, lane.budgets_s[name], lane)
    return {"overrides": overrides, **summarize_run(lane.work / name, run)}


def b_overrides(lane: Lane, model: Path) -> list[str]:
    """Part b's run: 32 trajectories a step (smoke: the profile's), one PPO epoch, micro-batches of
    8 rows, B_TOKENS_PER_ACTION tokens an action, every role in bf16 (smoke: float32) on GPU 0."""
    dtype = "float32" if lane.smoke else "bf16"
    return [
        f"pretrain={model}",
        f"max_steps={lane.steps['b']}",
        "save_steps=0",
        "eval_steps=0",
        *([] if lane.smoke else ["rollout_batch_size=32", "train_env_manager.num_env_groups=4"]),
        "ppo_epochs=1",
        "actor_train.training_args.learning_rate=1.0e-6",
        "actor_train.training_args.per_device_train_batch_size=8",
        "actor_train.training_args.gradient_accumulation_steps=4",
        "+reference.infer_batch_size=8",
        f"custom_env.TinyFrozenLake.max_tokens_per_step={B_TOKENS_PER_ACTION}",
        *[f"{role}.model_args.dtype={dtype}" for role in ("actor_train", "actor_infer")],
        f"+reference.model_args.dtype={dtype}",
        *REFERENCE,
        *lane.devices(),
        *lane.profile(),
    ]


def part_b(lane: Lane) -> dict:
    overrides = b_overrides(lane, qwen2_shaped_model(lane))
    run = run_pipeline("b", overrides, lane.work / "b", lane.budgets_s["b"], lane)
    result = {"overrides": overrides, **summarize_run(lane.work / "b", run)}
    if not lane.smoke and torch.cuda.is_available():
        result["engine_alone"] = engine_alone()
    result.update(floors_of(lane, model_dir=overrides[0].split("=", 1)[1], output_dir=lane.work / "b"))
    return result


def floors_of(lane: Lane, model_dir: str, output_dir: Path) -> dict:
    """Part b's phases against their floors on this device (benchmarks/gpu/phase_floors.py), measured
    after the run; on CPU (smoke) the same arithmetic with the CPU's figures."""
    from benchmarks.gpu import phase_floors

    device, dtype = ("cpu", "float32") if lane.smoke or not torch.cuda.is_available() else ("cuda", "bf16")
    try:
        facts = phase_floors.device_facts(model_dir, batch=32, dtype=dtype, device=device)
    except Exception as err:  # a figure beside the run's, never a reason to lose the record
        return {"floors": {"error": f"{type(err).__name__}: {err}"}}
    steps = read_metrics(output_dir)[1:]  # the first step is a warm-up
    return {"device_facts": facts, **phase_floors.phase_floors(steps, facts, ppo_epochs=1)}


def engine_alone() -> dict:
    """The `hf` engine without the pipeline on the same shape: benchmarks/gpu/gpu_lane.py's generation
    (32 prompts of 64 tokens, B_TOKENS_PER_ACTION sampled tokens each)."""
    from benchmarks.gpu import gpu_lane

    settings = gpu_lane.lane_settings(smoke=False, steps=None)
    settings = dataclasses.replace(settings, gen_prompts=32, gen_tokens=B_TOKENS_PER_ACTION)
    try:
        return gpu_lane.generate(settings)
    except Exception as err:  # a figure beside the pipeline's, never a reason to lose the record
        return {"error": f"{type(err).__name__}: {err}"}


def c_overrides(lane: Lane, done: int) -> list[str]:
    """Part a's run resumed from its checkpoint of step `done`, for steps_c more steps."""
    overrides = [o for o in a_overrides(lane) if not o.startswith(("max_steps=", "save_steps="))]
    return overrides + [f"max_steps={done + lane.steps['c']}", "save_steps=0", "resume_from_checkpoint=true"]


def part_c(lane: Lane) -> dict:
    """Loads part a's last checkpoint on CPU, then resumes part a's run for steps_c more steps."""
    base = lane.work / "a"
    checkpoints = sorted((base / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    if not checkpoints:
        return {"status": "skipped", "why": f"no checkpoint under {base}/checkpoints: run part a first"}
    last = checkpoints[-1]
    loaded = resume_check(last)
    done = int(last.name.split("_")[1])
    overrides = c_overrides(lane, done)
    run = run_pipeline("c", overrides, base, lane.budgets_s["c"], lane, fresh=False)
    summary = summarize_run(base, run, first_step=done + 1)
    return {"checkpoint": str(last), "loaded_on_cpu": loaded, "resumed_from_step": done, **summary}


# ---- the record -----------------------------------------------------------------------------
def new_record(lane: Lane) -> dict:
    import transformers

    cuda = torch.cuda.is_available() and not lane.smoke
    return {
        "lane": "gpu_e2e",
        "smoke": lane.smoke,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(0) if cuda else f"cpu ({os.cpu_count()} cores)",
        "commit": _commit(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu_load_1min": os.getloadavg()[0],
        "steps": lane.steps,
        "budgets_s": lane.budgets_s,
        "parts": {},
    }


def headline(record: dict) -> None:
    """The figures the issue names, at the top of the record."""
    parts = record["parts"]
    record["time_to_val_0_9_s"] = parts.get("a", {}).get("time_to_val_0_9_s")
    record["step_s_a"] = parts.get("a", {}).get("step_s", {}).get("median")
    record["weight_sync_s"] = parts.get("b", {}).get("split_s", {}).get("sync")
    record["weight_sync_path"] = parts.get("b", {}).get("weight_sync_path")
    record["time_idle_fraction"] = {
        p: r.get("time_idle_fraction") for p, r in parts.items() if "time_idle_fraction" in r
    }
    record["phase_floor_ratio"] = parts.get("b", {}).get("phase_floor_ratio")


def _commit() -> str | None:
    """git's commit, else $ROLL_COMMIT (a tree sent to a lent machine travels without .git)."""
    if os.environ.get("ROLL_COMMIT"):
        return os.environ["ROLL_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def record_path(today: str | None = None) -> Path:
    """results/gpu-e2e-<date>.json, or -2, -3, ... after it (a second run keeps the first's record)."""
    from benchmarks.gpu import gpu_lane

    return gpu_lane.new_record_path(REPO / "benchmarks" / "results", today, prefix="gpu-e2e")


def parse_budgets(text: str | None, smoke: bool = False) -> dict[str, float]:
    """--budget_s: one number for every part, or part=seconds pairs ("a=240,b=150"); the defaults
    are DEFAULT_BUDGETS_S, or SMOKE_BUDGET_S a part in smoke mode (a shared CPU may be slow)."""
    budgets = dict.fromkeys(PARTS, SMOKE_BUDGET_S) if smoke else dict(DEFAULT_BUDGETS_S)
    if not text:
        return budgets
    if "=" not in text:
        return dict.fromkeys(budgets, float(text))
    for pair in text.split(","):
        part, seconds = pair.split("=")
        if part not in budgets:
            raise SystemExit(f"--budget_s: unknown part {part!r} (parts: {', '.join(PARTS)})")
        budgets[part] = float(seconds)
    return budgets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny models, 2 steps a part; record only in --out")
    parser.add_argument("--parts", default="a,b,c", help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--out", default=None, help="folder for record.json and each part's log and metrics")
    parser.add_argument("--work", default=str(REPO / "output" / "gpu_e2e"), help="where the runs write")
    parser.add_argument("--budget_s", default=None, help="seconds a part may run: N, or a=N,b=N,c=N")
    parser.add_argument("--steps_a", type=int, default=None, help="part a's training steps (200; smoke 2)")
    parser.add_argument("--steps_b", type=int, default=None, help="part b's training steps (5; smoke 2)")
    parser.add_argument("--steps_c", type=int, default=None, help="steps resumed in part c (3; smoke 1)")
    parser.add_argument(
        "--a_extra", action="append", default=[], help="a hydra override added to parts a and c (repeatable)"
    )
    parser.add_argument(
        "--profile_calls", default="", help="ROLL_PROFILE_CALLS for the workers, e.g. train@20 (call_profile.py)"
    )
    parser.add_argument(
        "--spy", default=None, help="STEP:SECONDS: py-spy every process of parts a/a_cpu once STEP is logged (spy.py)"
    )
    args = parser.parse_args(argv)
    spy_step, _, spy_seconds = (args.spy or "").partition(":")
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f"--parts: unknown {unknown} (parts: {', '.join(PARTS)})")
    if not args.smoke and not torch.cuda.is_available():
        print("no CUDA device: skipped (the pipeline on a GPU); nothing written. `--smoke` runs the parts on CPU")
        return 0
    steps = {
        "a": args.steps_a or (SMOKE_STEPS if args.smoke else 200),
        "b": args.steps_b or (SMOKE_STEPS if args.smoke else 5),
        "c": args.steps_c or (1 if args.smoke else 3),
    }
    steps["a_cpu"] = steps["a"]
    lane = Lane(
        smoke=args.smoke,
        work=Path(args.work),
        out=Path(args.out) if args.out else None,
        steps=steps,
        budgets_s=parse_budgets(args.budget_s, args.smoke),
        record_path=None if args.smoke else record_path(),
        a_extra=args.a_extra,
        profile_calls=args.profile_calls,
        spy=(int(spy_step), float(spy_seconds)) if args.spy else None,
    )
    lane.record = new_record(lane)
    runners = {"a": part_a, "b": part_b, "c": part_c, "a_cpu": lambda lane: part_a(lane, cpu=True)}
    signal.signal(signal.SIGTERM, lambda signum, frame: _TERMINATED.append(signum))
    for part in parts:
        if _TERMINATED:
            break
        print(f"gpu_e2e: part {part} ...", flush=True)
        lane.record["parts"][part] = runners[part](lane)
        headline(lane.record)
        lane.save()
        print(f"gpu_e2e: part {part}: {json.dumps(_brief(lane.record['parts'][part]))}", flush=True)
    for path in (lane.record_path, lane.out / "record.json" if lane.out else None):
        if path is not None:
            print(f"wrote {path}")
    if _TERMINATED:
        return 128 + signal.SIGTERM
    failed = [p for p, r in lane.record["parts"].items() if r.get("status") not in ("ok", "stopped_at_budget")]
    return 1 if failed else 0


def _brief(result: dict) -> dict:
    keys = ("status", "steps_done", "time_to_val_0_9_s", "step_s", "split_s", "weight_sync_path", "peak_memory_gib")
    return {k: result[k] for k in keys if k in result}


if __name__ == "__main__":
    sys.exit(main())
