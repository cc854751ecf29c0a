"""Config to CPU shares: which cores and torch threads each worker process gets.

A role's own `strategy_config.cpu_affinity` / `num_threads` win; otherwise a CPU run on one
machine takes `roll.distributed.cpu_affinity.default_cpu_shares` (GPU runs and Ray clusters get
no default: their roles do not share one machine's cores the same way). Pinning happens inside
each worker process right after it starts (`pin_workers`), so no worker class needs to know.

The training roles take turns within a step, except in the score phase, where actor_train,
reference and critic each run a forward pass over the batch. Where they would oversubscribe
the cores (a CPU run on one machine whose roles' threads together outnumber the cores they may
run on: by default every synchronous CPU run), those passes run one after another
(`score_in_turns`), each with the role's whole share: at once, two pools sized to the same cores
spin and wait on each other (`benchmarks/host/role_cores.py`).
`ROLL_SCORE_IN_TURNS=0` in the driver's environment runs them at once anyway, to compare.
"""

from __future__ import annotations

from collections.abc import Callable

import ray

from roll.configs.worker import cpu_options
from roll.distributed.cpu_affinity import (
    ENV_WORKERS,
    INFERENCE,
    TRAINING,
    CpuShare,
    apply_share,
    default_cpu_shares,
    split_cores,
    usable_cores,
)
from roll.pipeline.setup import cluster
from roll.utils.env_switches import switched_on

SCORE_SWITCH = "ROLL_SCORE_IN_TURNS"
_GROUP = {"actor_infer": INFERENCE, "actor_train": TRAINING, "critic": TRAINING, "reference": TRAINING}


def role_share(cfg, role: str, cores: tuple[int, ...] | None = None) -> CpuShare:
    """The share of `role` (a config role, or `ENV_WORKERS`) before it is split among the role's
    processes; `cores`: the machine's usable cores (default: this process's)."""
    if role != ENV_WORKERS:
        affinity, threads = cpu_options(role, getattr(cfg, role))
        if affinity is not None or threads is not None:
            return CpuShare(
                None if affinity is None else tuple(affinity),
                threads if threads is not None else (len(affinity) if affinity else None),
            )
    if cluster.joined() or any(cfg.device_layout["mappings"].values()):
        return CpuShare()
    shares = default_cpu_shares(usable_cores() if cores is None else cores, cfg.steps_ahead > 0)
    return shares[_GROUP.get(role, role)]


def process_shares(cfg, role: str, processes: int) -> list[CpuShare]:
    """`role_share` split among the role's `processes` processes (ranks or replicas)."""
    return split_cores(role_share(cfg, role), processes)


def _pin(_actor, share: CpuShare) -> None:  # runs inside the actor (`__ray_call__`)
    apply_share(CpuShare(share.cores, None))


def pin_workers(handles: list, shares: list[CpuShare]) -> list:
    """Start pinning each actor of `handles` to its share's cores (threads are set by the worker's
    own `num_threads`); actors without cores are left alone. Returns the pins' refs: `ray.get`
    them (each completes once its actor is built) before the first call on an async actor (the
    engine, env workers), which may run later calls before an earlier one. Waiting once for all of
    a run's actors lets them load their models side by side. An env worker that Ray restarts runs
    unpinned."""
    return [h.__ray_call__.remote(_pin, s) for h, s in zip(handles, shares, strict=True) if s.cores is not None]


def score_in_turns(cfg, roles: list[str], cores: tuple[int, ...] | None = None) -> bool:
    """Whether the score phase's passes of `roles` run one after another (module docstring): a CPU
    run on one machine where the roles' torch threads together outnumber the cores they may run
    on (a role not pinned may run on every core; a role's threads default to its cores' count);
    `cores`: the machine's usable cores (default: this process's)."""
    if not switched_on(SCORE_SWITCH):
        return False
    if len(roles) < 2 or cluster.joined() or any(cfg.device_layout["mappings"].values()):
        return False
    machine = usable_cores() if cores is None else cores
    shares = [role_share(cfg, role, machine) for role in roles]
    held = [set(share.cores or machine) for share in shares]
    threads = sum(share.num_threads or len(mine) for share, mine in zip(shares, held, strict=True))
    return threads > len(set().union(*held))


def call_all(calls: dict[str, Callable[[], ray.ObjectRef]], in_turns: bool, timeout_s: float) -> dict:
    """Each call's result by key: every call started at once, or with `in_turns` each started once
    the one before has returned."""
    if in_turns:
        return {key: ray.get(call(), timeout=timeout_s) for key, call in calls.items()}
    refs = {key: call() for key, call in calls.items()}
    return {key: ray.get(ref, timeout=timeout_s) for key, ref in refs.items()}
