"""The set-up every pipeline runs before its loop: the config checks, the device plan, Ray, the
tokenizer, the trackers. Shared by `AgenticPipeline` (training) and `AgenticRolloutPipeline` (rollout only)."""

from __future__ import annotations

import signal
import threading

import ray

from roll.distributed.rank_group import process_handles
from roll.models.loading import load_tokenizer
from roll.models.templates import apply_template
from roll.pipeline.checks.config import check_before_start
from roll.pipeline.phases.gpu_offload import PhaseResidency
from roll.pipeline.setup.builders import init_ray, place_workers
from roll.pipeline.setup.cluster import ray_target
from roll.tracking.backends import make_backend
from roll.tracking.traces import RolloutTracer
from roll.tracking.tracker import Tracker
from roll.utils import heap

RAY_TIMEOUT_S = 1800.0
"""Default of `rpc_timeout`: no call on a worker may hang forever."""
FREEZE_WAIT_S = 60.0
"""The longest `freeze_heaps` waits for the workers: freezing is worth no longer a pause."""


def start(cfg) -> PhaseResidency:
    """Envs, datasets and the device layout checked (`ConfigError` on a bad one), the workers'
    devices planned (before Ray starts on one machine; on a cluster once joined), Ray started or
    joined with `system_envs`. Returns the plan as a `PhaseResidency` whose calls wait at most
    `rpc_timeout`."""
    check_before_start(cfg)
    local_plan = None if ray_target(cfg.ray_address) else place_workers(cfg)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    init_ray(cfg.ray_address, cfg.system_envs)
    residency = PhaseResidency(local_plan or place_workers(cfg), timeout_s=rpc_timeout(cfg))
    if threading.current_thread() is threading.main_thread():
        for sig, handler in handlers.items():  # ray.init replaces them, and Ray's C handler dumps a stack
            if handler is not None:
                signal.signal(sig, handler)
    return residency


def freeze_heaps(workers: dict, rollouts: list, timeout_s: float) -> None:
    """`roll.utils.heap.freeze_heap` in the driver and in every process of the run: the roles of
    `workers` (`build_workers`' dict) and the env workers of `rollouts` (None entries skipped);
    nothing with `ROLL_GC_FREEZE=0`. Freezing only saves time, so a process that is gone (an env
    worker killed for good) or has not answered within `timeout_s` (at most `FREEZE_WAIT_S`: one
    still restarting) is passed over; one that Ray restarts later is not frozen."""
    if not heap.enabled():
        return
    actors = [h for entry in workers.values() for h in process_handles(entry)]
    actors += [h for rollout in rollouts if rollout is not None for h in rollout.workers]
    heap.freeze_heap()
    if not actors:
        return
    refs = heap.freeze_actors(actors)
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=min(timeout_s, FREEZE_WAIT_S))
    for ref in ready:
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError:  # died meanwhile; the scheduler deals with its groups
            pass


def rpc_timeout(cfg) -> float:
    """Seconds the driver waits for one call on a worker (ROLL's `rpc_timeout`)."""
    return cfg.rpc_timeout or RAY_TIMEOUT_S


def run_tokenizer(cfg):
    """`actor_infer`'s tokenizer with the config's chat template: what prompts are rendered with."""
    return apply_template(
        load_tokenizer(cfg.actor_infer.model_args.model_name_or_path), cfg.actor_infer.data_args.template
    )


def make_tracker(cfg, resume_step: int) -> Tracker:
    """metrics.jsonl, TensorBoard and the `track_with` backend; `resume_step` -1: a fresh run."""
    return Tracker(
        cfg.output_dir,
        cfg.tensorboard_dir,
        resume_step=resume_step,
        backend=make_backend(cfg.track_with, cfg.tracker_kwargs.model_dump(), cfg.exp_name),
    )


def make_tracer(cfg, tokenizer, tracker: Tracker) -> RolloutTracer | None:
    """The rollout tracer when `trace_rollouts` is on."""
    if not cfg.trace_rollouts:
        return None
    return RolloutTracer(
        cfg.output_dir, tokenizer, tracker, cfg.trace_samples_to_tensorboard, mlflow=cfg.trace_to_mlflow
    )
