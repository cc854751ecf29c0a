"""Soak: the tiny FrozenLake example for many steps with env faults and killed env workers.

One run of `examples/frozen_lake` (small batches, the tiny local model) with 1% of env steps
failing (`fault_injection`: a third raise, a third hang until the step timeout, a third return
garbage) and `--kills` processes killed with SIGKILL at moments drawn from `--seed`, an env worker
and the inference engine in turn (Ray restarts them; the engine reloads the last synced weights;
the groups that were being played are played again). Every `--sample_s` seconds the
script samples the run's processes (its own session: driver, Ray, workers): resident memory
(RSS) summed, open files summed, and the steps logged. At the end it checks that every step
1..N is in metrics.jsonl exactly once and prints a table:

    python benchmarks/reliability/soak.py --steps 1000 --kills 3 --out output/soak

Last line: `RESULT soak_steps=... exit=... missing_steps=... kills=... dropped=... rss_first_mb=...
rss_last_mb=... files_first=... files_last=...` (first/last: the means of the second and the last
fifth of the samples taken while training, so that neither start-up nor the teardown after the last step
counts as drift); every sample goes to
`soak_samples.csv` beside `--out`, and a table of the memory by process kind (driver, Ray's own
processes, each kind of worker), first window against last, shows where any rise is.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: import from this checkout
from benchmarks.common import REPO

RUN = [
    "--config_path",
    "frozen_lake",
    "--config_name",
    "agent_val_frozen_lake",
    "eval_steps=0",
    "rollout_batch_size=8",
    "train_env_manager.num_env_groups=2",
    "train_env_manager.group_size=4",
    "train_env_manager.env_step_timeout_s=2",
    "actor_train.training_args.per_device_train_batch_size=8",
    "actor_train.training_args.gradient_accumulation_steps=1",
]


def fault_override(rate: float) -> str:
    third = rate / 3
    return (
        f"+custom_envs.FrozenLake.env_config.fault_injection="
        f"{{raise_p:{third},hang_p:{third},garbage_p:{third},hang_s:30,seed:1}}"
    )


def session_processes(sid: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getsid(proc.pid) == sid:
                found.append(proc)
        except (ProcessLookupError, PermissionError):
            continue
    return found


KILLED = ("ray::EnvWorker", "ray::InferenceWorker")  # killed in turn


def sample(sid: int, title: str) -> tuple[float, int, list[psutil.Process], dict[str, float]]:
    """(RSS MiB, open files, processes whose title starts with `title`, RSS MiB by process kind: the
    title up to its first dot)
    of the run's session."""
    rss, files, found, by_kind = 0, 0, [], {}
    for proc in session_processes(sid):
        try:
            mem, name = proc.memory_info().rss, proc.name()
            files += proc.num_fds()
        except psutil.Error:
            continue
        rss += mem
        kind = name.split(".")[0]  # ray::ActorWorker.train -> ray::ActorWorker: the title names the running method
        by_kind[kind] = by_kind.get(kind, 0.0) + mem / 2**20
        if name.startswith(title):
            found.append(proc)
    return rss / 2**20, files, found, by_kind


def logged_steps(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--kills", type=int, default=6, help="workers killed with SIGKILL (env worker, engine in turn)")
    parser.add_argument("--fault_rate", type=float, default=0.01, help="share of env steps that fail")
    parser.add_argument("--sample_s", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="output/soak")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    model = out.parent / "soak-model"
    subprocess.run(
        [sys.executable, "-m", "roll.pipeline.tiny_model", "--preset", "frozen_lake", "--output_dir", str(model)],
        cwd=REPO,
        check=True,
    )
    rng = random.Random(args.seed)
    kill_at = sorted(rng.sample(range(2, args.steps), min(args.kills, args.steps - 2)))  # after these steps
    command = [sys.executable, "examples/start_agentic_pipeline.py", *RUN, f"max_steps={args.steps}"]
    command += [f"save_steps={max(args.steps // 4, 1)}", f"pretrain={model}", f"output_dir={out}"]
    command += ["overwrite_output_dir=true", fault_override(args.fault_rate)]
    log = out.parent / "soak.log"
    started = time.monotonic()
    proc = subprocess.Popen(
        command,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
        start_new_session=True,
    )
    samples, kills = [], []
    try:
        while proc.poll() is None:
            rss, files, victims, by_kind = sample(proc.pid, KILLED[len(kills) % len(KILLED)])
            steps = logged_steps(out)
            samples.append((time.monotonic() - started, len(steps), rss, files, by_kind))
            if kill_at and steps and steps[-1] >= kill_at[0] and victims:
                victim = rng.choice(victims)
                victim.send_signal(signal.SIGKILL)
                kills.append((steps[-1], victim.pid))
                kill_at.pop(0)
            time.sleep(args.sample_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    report(args, out, proc.returncode, samples, kills, time.monotonic() - started, log)


def print_by_kind(first: list, last: list) -> None:
    """Which processes the memory is in, by kind, first window against last (MiB, means)."""
    kinds = sorted({t for rows in (first, last) for r in rows for t in r[4]})

    def mean(rows: list, kind: str) -> float:
        return sum(r[4].get(kind, 0.0) for r in rows) / len(rows)

    print("| process | RSS MiB first | RSS MiB last | change |")
    print("|---|---|---|---|")
    for t in sorted(kinds, key=lambda t: -abs(mean(last, t) - mean(first, t))):
        print(f"| {t} | {mean(first, t):.0f} | {mean(last, t):.0f} | {mean(last, t) - mean(first, t):+.0f} |")


def report(args, out: Path, returncode: int, samples: list, kills: list, wall_s: float, log: Path) -> None:
    steps = logged_steps(out)
    missing = sorted(set(range(1, args.steps + 1)) - set(steps))
    repeated = len(steps) - len(set(steps))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()] if steps else []
    dropped = sum(r.get("rollout/dropped_trajectories", 0) for r in rows)
    # memory while training: the samples after the last step is logged catch the run tearing down
    training = [s for s in samples if s[1] < args.steps] or samples
    fifth = max(len(training) // 5, 1)
    first, last = training[fifth : 2 * fifth] or training[:fifth], training[-fifth:]  # after start-up; the end
    with open(out.parent / "soak_samples.csv", "w") as f:  # every sample, to plot
        f.write("wall_s,steps_logged,rss_mib,open_files\n")
        f.writelines(f"{t:.1f},{n},{rss:.1f},{files}\n" for t, n, rss, files, _ in samples)
    print_by_kind(first, last)
    mean = lambda rows, i: sum(r[i] for r in rows) / len(rows)  # noqa: E731
    print("| steps | exit | wall s | kills | dropped trajectories | RSS MiB first/last | open files first/last |")
    print("|---|---|---|---|---|---|---|")
    print(
        f"| {len(set(steps))}/{args.steps} | {returncode} | {wall_s:.0f} | {len(kills)} | {dropped:.0f} | "
        f"{mean(first, 2):.0f} / {mean(last, 2):.0f} | {mean(first, 3):.0f} / {mean(last, 3):.0f} |"
    )
    if returncode != 0:
        print(log.read_text()[-2000:])
    print(
        f"RESULT soak_steps={len(set(steps))} exit={returncode} missing_steps={len(missing)} repeated={repeated} "
        f"kills={len(kills)} dropped={dropped:.0f} rss_first_mb={mean(first, 2):.0f} rss_last_mb={mean(last, 2):.0f} "
        f"files_first={mean(first, 3):.0f} files_last={mean(last, 3):.0f} wall_s={wall_s:.0f}"
    )


if __name__ == "__main__":
    main()
