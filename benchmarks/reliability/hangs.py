"""How long each kind of hang goes unnoticed: seconds from the hang to the named report, against
its bound (issue 52: "a hang is noticed within 2x its bound").

Each hang is injected into the real part at a small bound `--bound` seconds, `--repeats` times:
- env_step: an env whose `step` never returns, through `EnvCaller` (the env manager's bounded
  call; `env_step_timeout_s`) -> `EnvStepTimeout`, the episode dropped with it;
- engine: an inference handle that never answers, behind a real in-process `EnvWorker`
  (`generate_timeout_s`) -> `EngineHung`, the run stops;
- env_worker: a Ray env worker whose event loop is blocked, under a real `RolloutScheduler`
  (`env_monitor.hung_timeout`, then a probe of `probe_s`) -> the worker killed, Ray restarts it;
- training_call: a Ray actor stuck in its call, awaited under `named_hangs` (`rpc_timeout`, then
  a probe of `PROBE_S`) -> `WorkerHung`, the run stops.
(The agent program that never calls back is `asyncio.wait_for(run_job, episode_timeout_s)` in
`ProxyEnvManager`: tests/agentic/test_proxy_env_manager.py.)

The detection time is the bound plus what follows it: for the two probed kinds the probe's full
wait (a stuck process does not answer), min(10 s, bound / 2), so the ratio at the default bounds
is (default + 10 s + the rest of the measured overhead) / default, printed as `ratio_at_default`.

    python benchmarks/reliability/hangs.py [--bound 2 --repeats 3]

Last line: `RESULT <kind>_ratio=<detected/bound> <kind>_ratio_at_default=<...> ...`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import ray

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: import from this checkout


from envs.frozen_lake.env import FrozenLakeEnv
from roll.agentic.env_manager.env_calls import EnvCaller, EnvStepTimeout
from roll.agentic.episode import EnvSpec
from roll.agentic.rollout.env_worker import EnvWorker, GroupSpec
from roll.agentic.rollout.scheduler import RolloutFailed, RolloutScheduler, Slot
from roll.core.errors import EngineHung
from roll.core.records import GroupResult, SamplingParams
from roll.models.tiny import build_tiny_model
from roll.pipeline.failures.hangs import PROBE_S, WorkerHung, named_hangs

DEFAULTS = {"env_step": 60.0, "engine": 300.0, "env_worker": 900.0, "training_call": 1800.0}
"""The default bound of each kind (env_step_timeout_s, generate_timeout_s, env_monitor.hung_timeout, rpc_timeout)."""
SCHEDULER_PROBE_S = 10.0  # RolloutScheduler's default probe_s


class NeverSteps(FrozenLakeEnv):
    """`step` never returns until the env is closed (what `EnvCaller` does on a timeout)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.closed = threading.Event()

    def step(self, action):
        self.closed.wait()

    def close(self):
        self.closed.set()


class _Method:
    def __init__(self, fn):
        self.remote = fn


class SilentEngine:
    """An inference handle whose calls never answer."""

    def __init__(self):
        self.generate_many = _Method(self._never)
        self.release_sessions = _Method(lambda ids: None)

    async def _never(self, requests):
        await asyncio.Event().wait()


@ray.remote(num_cpus=0, max_restarts=-1)
class BlockedWorker:
    def __init__(self):
        import roll.agentic.rollout.env_worker  # noqa: F401  (what a group's arguments need: loaded before)

    async def ping(self) -> bool:
        return True

    async def run_group(self, slot: int, spec) -> GroupResult:
        if not ray.get_runtime_context().was_current_actor_reconstructed:
            time.sleep(3600)  # blocks the event loop: alive, answers nothing
        return GroupResult(spec.group_index, [], ["replayed"])


@ray.remote(num_cpus=0)
class StuckTrainer:
    def train_step(self):
        threading.Event().wait()


class Residency:
    def __init__(self, handles):
        self.phase, self._handles = "train", handles

    def handles(self, roles=None):
        return self._handles


def env_step(bound: float, _model: str) -> float:
    caller = EnvCaller(NeverSteps(), timeout_s=bound)
    caller.inline.discard("step")  # the thread path (a call declared cheap runs inline: env_worker)
    start = time.monotonic()
    try:
        asyncio.run(caller("step", "Left"))
    except EnvStepTimeout:
        return time.monotonic() - start
    raise AssertionError("no EnvStepTimeout")


def engine(bound: float, model: str) -> float:
    spec = EnvSpec(tag="FL", env_type="frozen_lake", env_config={}, max_steps=2, max_tokens_per_step=1)

    async def play() -> float:
        worker = EnvWorker([spec], 1, model, SilentEngine(), SamplingParams(), 4096, generate_timeout_s=bound)
        start = time.monotonic()
        try:
            await worker.run_group(0, GroupSpec(0, "g", env_seed=1, sample_seed=1))
        except EngineHung:
            return time.monotonic() - start
        raise AssertionError("no EngineHung")

    return asyncio.run(play())


def env_worker(bound: float, _model: str) -> float:
    worker = BlockedWorker.remote()
    ray.get(worker.ping.remote())
    scheduler = RolloutScheduler(
        [worker], [Slot(0, 0, "FL")], seed=1, mode="train", hung_timeout_s=bound, probe_s=SCHEDULER_PROBE_S
    )
    start = time.monotonic()
    collecting = threading.Thread(target=_collect_until_it_fails, args=(scheduler,), daemon=True)
    collecting.start()
    while not scheduler.watch.restarted:  # the named kill: what the user sees logged
        time.sleep(0.01)
    detected = time.monotonic() - start
    ray.kill(worker, no_restart=True)  # its replayed groups fail now, and the collect with them
    collecting.join()
    return detected


def _collect_until_it_fails(scheduler: RolloutScheduler) -> None:
    try:
        scheduler.collect(1, 1)
    except RolloutFailed:
        pass


def training_call(bound: float, _model: str) -> float:
    trainer = StuckTrainer.remote()
    ref = trainer.train_step.remote()
    start = time.monotonic()
    try:
        with named_hangs(Residency({("actor_train", 0): trainer}), bound, lambda: 1, lambda: None):
            ray.get(ref, timeout=bound)
    except WorkerHung:
        detected = time.monotonic() - start
        ray.kill(trainer)
        return detected
    raise AssertionError("no WorkerHung")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bound", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    model = build_tiny_model(tempfile.mkdtemp(prefix="hangs-"), corpus=["You are P."], seed=3)
    print(f"bound {args.bound:g} s, {args.repeats} repeats, load {os.getloadavg()[0]:.1f}")
    print("| hang | bound (s) | detected (s, median) | ratio | overhead (s) | default bound (s) | ratio at default |")
    print("|---|---|---|---|---|---|---|")
    result = []
    for kind, fn in {
        "env_step": env_step,
        "engine": engine,
        "env_worker": env_worker,
        "training_call": training_call,
    }.items():
        detected = statistics.median(fn(args.bound, model) for _ in range(args.repeats))
        overhead = detected - args.bound
        probe = min(SCHEDULER_PROBE_S if kind == "env_worker" else PROBE_S, args.bound / 2)
        probe_at_default = 10.0 if kind in ("env_worker", "training_call") else 0.0
        at_default = (DEFAULTS[kind] + overhead - (probe if probe_at_default else 0.0) + probe_at_default) / DEFAULTS[
            kind
        ]
        ratio = detected / args.bound
        cells = [kind, f"{args.bound:g}", f"{detected:.2f}", f"{ratio:.2f}", f"{overhead:.2f}", f"{DEFAULTS[kind]:g}"]
        print("| " + " | ".join([*cells, f"{at_default:.3f}"]) + " |")
        result += [f"{kind}_ratio={ratio:.2f}", f"{kind}_ratio_at_default={at_default:.3f}"]
    print(f"load {os.getloadavg()[0]:.1f}; probes: scheduler {SCHEDULER_PROBE_S:g} s, training {PROBE_S:g} s")
    print("RESULT " + " ".join(result))
    ray.shutdown()


if __name__ == "__main__":
    main()
