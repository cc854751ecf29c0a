"""Which roles hold their GPUs in each phase of a step, when roles share GPUs (ROLL's colocated
mode; `roll.distributed.placement` says who shares what).

Each phase needs some roles on their devices (`PHASE_ROLES`). `PhaseResidency.enter(phase)` first
offloads every process the phase does not need that shares a device with one it needs, then
reloads the needed processes that are offloaded: memory is freed before it is claimed again. A
process whose devices nobody else uses is never touched, so with no colocation (every CPU run)
`enter` makes no call at all.

Over one synchronous step of a fully colocated layout that gives: rollout on the engine (training
roles offloaded) -> score (engine offloaded; actor, reference, critic reloaded) -> train (reference
offloaded) -> sync (actor and critic offloaded, engine reloaded, then the new weights loaded into
the awake engine; the actor's weights were taken before it left the GPU) -> validate on the engine
-> checkpoint (engine offloaded, actor and critic reloaded; only on save steps). Colocating the
engine with a training role needs `async_generation_ratio: 0`: with k > 0 rollout runs during
scoring and training (the config refuses it).

`seconds` adds up the time spent waiting for offloads and reloads; `take_seconds` hands it to the
pipeline's step metrics (`time/offload_s`, `time/reload_s`, parts of the phase times) and restarts it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import ray

from roll.distributed.placement import DevicePlan, ProcessPlacement
from roll.distributed.rank_group import RankGroup

PHASE_ROLES: dict[str, tuple[str, ...]] = {
    "rollout": ("actor_infer",),
    "score": ("actor_train", "reference", "critic"),
    "train": ("actor_train", "critic"),
    "sync": ("actor_infer",),  # the actor's weights are CPU copies taken before it is offloaded
    "sync_on_device": ("actor_infer", "actor_train"),  # the engine copies from the actor's GPU tensors
    "validate": ("actor_infer",),
    "checkpoint": ("actor_train", "critic"),
}
"""The roles each phase runs, hence needs on their devices."""
WORKER_ROLES = {"actor": "actor_train", "inference": "actor_infer", "critic": "critic", "reference": "reference"}
"""The pipeline's worker keys (`build_workers`) by config role."""

Key = tuple[str, int]  # (role, process index)


class PhaseResidency:
    """Offloads and reloads the worker processes of a `DevicePlan` as the pipeline enters phases.

    A process counts from `attach` on, resident: the pipeline builds roles on their devices. `get`
    waits for a list of Ray object refs (`ray.get` with `timeout_s`; tests pass their own).
    """

    def __init__(self, plan: DevicePlan, *, timeout_s: float = 1800.0, get: Callable[[list], Any] | None = None):
        self.plan = plan
        self._get = get or (lambda refs: ray.get(refs, timeout=timeout_s))
        self._handles: dict[Key, Any] = {}
        self.offloaded: set[Key] = set()
        self.seconds = {"offload": 0.0, "reload": 0.0}

    def attach(self, role: str, handles: Sequence[Any]) -> None:
        """The actor handles of a role's processes, in the plan's process order."""
        planned = self.plan.processes[role]
        if len(handles) != len(planned):
            raise ValueError(f"{role}: {len(handles)} handles for {len(planned)} planned processes")
        self._handles.update({(role, i): handle for i, handle in enumerate(handles)})

    def attach_workers(self, workers: dict[str, Any]) -> None:
        """`attach` every role of the pipeline's worker dict (the inference entry is a list, a role
        of several ranks a `RankGroup`: each rank is offloaded and reloaded on its own)."""
        for key, handles in workers.items():
            if isinstance(handles, RankGroup):
                handles = handles.handles
            self.attach(WORKER_ROLES[key], handles if isinstance(handles, list) else [handles])

    def enter(self, phase: str) -> None:
        """Make the phase's roles resident, offloading first whoever shares their devices."""
        needed = [p for role in PHASE_ROLES[phase] for p in self.plan.processes.get(role, ())]
        needed_keys = {(p.role, p.index) for p in needed}
        evict = [
            key
            for key in self._handles
            if key not in needed_keys
            and key not in self.offloaded
            and any(_share(self._placement(key), p) for p in needed)
        ]
        restore = [key for key in self._handles if key in needed_keys and key in self.offloaded]
        if evict:
            self._timed("offload", [self._handles[key].offload.remote() for key in evict])
            self.offloaded.update(evict)
        if restore:
            self._timed("reload", [self._handles[key].reload.remote() for key in restore])
            self.offloaded.difference_update(restore)

    def take_seconds(self) -> dict[str, float]:
        """`time/offload_s` and `time/reload_s` since the last call."""
        taken = {f"time/{kind}_s": seconds for kind, seconds in self.seconds.items()}
        self.seconds = dict.fromkeys(self.seconds, 0.0)
        return taken

    def _timed(self, kind: str, refs: list) -> None:
        start = time.perf_counter()
        self._get(refs)
        self.seconds[kind] += time.perf_counter() - start

    def _placement(self, key: Key) -> ProcessPlacement:
        return self.plan.process(*key)


def _share(a: ProcessPlacement, b: ProcessPlacement) -> bool:
    return a.device is not None and a.device == b.device
