"""Which CPU cores each role's processes run on, and how many torch threads they use.

On a CPU machine, inference, training and the env workers share the cores. In a synchronous run
the phases take turns (rollout, then scoring and training), so each may use every core in its
phase; in an async run (`async_generation_ratio > 0`) the engine generates while the trainer
trains, and two torch thread pools that each size themselves to the whole machine oversubscribe
it: their threads spin and wait on each other (measured: `benchmarks/host/role_cores.py`).

`strategy_config.num_threads` and `strategy_config.cpu_affinity` of a role set these by hand;
`default_cpu_shares` gives the defaults of a CPU run on one machine:
- more than 2 cores: the last core is left to the env workers (they tokenize and step envs all
  through rollout) and the roles are pinned to the others, one torch thread per core; in an
  async run inference gets the first half of those (rounded down, at least one) and the
  training roles the rest, in a synchronous run both get all of them;
- 2 cores or fewer: nothing is pinned. An async run splits the threads (one each on 2 cores):
  measured on 2 cores, two pools of 2 threads generated and trained 6-14x slower than two of 1
  thread, and pinning the two 1-thread pools to separate cores changed nothing beyond noise
  (docs/benchmarks.md, role_cores.py). A synchronous run keeps every core for each role.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

INFERENCE, TRAINING, ENV_WORKERS = "actor_infer", "training", "env_workers"
"""The three groups that compete for cores: the engine, the training roles (actor_train,
critic, reference, which take turns within a step), and the env workers."""


@dataclass(frozen=True)
class CpuShare:
    """Cores a group's processes are pinned to (None: not pinned) and their torch threads (None:
    the process's own default)."""

    cores: tuple[int, ...] | None = None
    num_threads: int | None = None


def default_cpu_shares(cores: Sequence[int], async_training: bool) -> dict[str, CpuShare]:
    """The default share of `INFERENCE`, `TRAINING` and `ENV_WORKERS` on a machine whose usable
    cores are `cores` (see the module docstring)."""
    cores = tuple(sorted(cores))
    if len(cores) <= 2:
        if not async_training or len(cores) < 2:
            return {INFERENCE: CpuShare(), TRAINING: CpuShare(), ENV_WORKERS: CpuShare()}
        return {INFERENCE: CpuShare(None, 1), TRAINING: CpuShare(None, 1), ENV_WORKERS: CpuShare()}
    roles, env_core = cores[:-1], cores[-1:]
    if async_training:
        split = max(1, len(roles) // 2)
        infer, train = roles[:split], roles[split:]
    else:
        infer = train = roles
    return {
        INFERENCE: CpuShare(infer, len(infer)),
        TRAINING: CpuShare(train, len(train)),
        ENV_WORKERS: CpuShare(env_core, 1),
    }


def split_cores(share: CpuShare, processes: int) -> list[CpuShare]:
    """`share` divided among `processes` processes of one role (ranks or replicas): contiguous
    runs of its cores, as even as they go; a process gets at least one core (shared when there
    are more processes than cores), and threads follow its cores."""
    if share.cores is None:
        threads = None if share.num_threads is None else max(1, share.num_threads // processes)
        return [CpuShare(None, threads)] * processes
    cores, out = share.cores, []
    for p in range(processes):
        mine = cores[p * len(cores) // processes : (p + 1) * len(cores) // processes] or (cores[p % len(cores)],)
        threads = len(mine) if share.num_threads is None else max(1, share.num_threads // processes)
        out.append(CpuShare(mine, threads))
    return out


def usable_cores() -> tuple[int, ...]:
    """The cores this process may run on (its affinity mask, which containers narrow)."""
    return tuple(sorted(os.sched_getaffinity(0)))


def pin_process(cores: Sequence[int]) -> None:
    """Pin every thread of this process to `cores`. `os.sched_setaffinity(0, ...)` pins only the
    calling thread; threads started since (torch's pool, Ray's, an executor's) are pinned one by
    one, and threads started later inherit the mask of the thread that starts them."""
    mask = set(cores)
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), mask)
        except ProcessLookupError:  # the thread ended meanwhile
            pass


def apply_share(share: CpuShare) -> None:
    """Pin this process to `share.cores` and set its torch threads (what a worker runs)."""
    import torch

    if share.cores is not None:
        pin_process(share.cores)
    if share.num_threads is not None:
        torch.set_num_threads(share.num_threads)
