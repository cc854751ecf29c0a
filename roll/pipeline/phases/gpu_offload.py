"""Which roles hold their GPUs in each phase of a step, when roles share GPUs (ROLL's colocated
mode; `roll.distributed.placement` says who shares what).

Each phase needs some roles on their devices (`PHASE_ROLES`). `PhaseResidency.enter(phase)` first
offloads every process the phase does not need that shares a device with one it needs, then
reloads the needed processes that are offloaded: memory is freed before it is claimed again. A
process whose devices nobody else uses is never touched, so with no colocation (every CPU run)
`enter` makes no call at all.

Over one synchronous step of a fully colocated layout that gives: rollout on the engine (training
roles offloaded) -> score (engine offloaded; actor, reference, critic reloaded; without the actor,
"score_without_actor", when it takes its old log-probs while training) -> train (reference
offloaded) -> sync (actor and critic offloaded, engine reloaded, then the new weights loaded into
the awake engine; the actor's weights were taken before it left the GPU) -> validate on the engine
-> checkpoint (engine offloaded, actor and critic reloaded; only on save steps). Colocating the
engine with a training role needs `async_generation_ratio: 0`: with k > 0 rollout runs during
scoring and training (the config refuses it).

With the CUDA IPC weight sync (`roll.distributed.weight_transfer`) the sync phase is
"sync_on_device": the engine wakes beside the actor, which it copies from. After the first step,
`stay_if_room` stops the turns on each device whose processes fit on it together (their reserved
peaks from `read_memory`, plus `PROCESS_OVERHEAD_GIB` each, within `ROOM_FRACTION`): those are
reloaded once, when a phase needs them, and never offloaded again. `take_seconds` hands the time
spent in offloads and reloads to the step metrics (`time/offload_s`, `time/reload_s`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import ray

from roll.distributed.placement import DevicePlan, ProcessPlacement
from roll.distributed.rank_group import process_handles

PHASE_ROLES: dict[str, tuple[str, ...]] = {
    "rollout": ("actor_infer",),
    "score": ("actor_train", "reference", "critic"),
    "score_without_actor": ("reference", "critic"),  # the actor takes its old log-probs when training
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
ROOM_FRACTION = 0.8
"""Colocated processes stay resident when their reserved peaks fill at most this much of the device."""
PROCESS_OVERHEAD_GIB = 1.0
"""Added for each process: its CUDA context and workspaces, which torch's allocator does not count."""


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
        self.resident_devices: set[int] = set()  # devices whose processes stopped taking turns
        self.phase = "start-up"  # the phase last entered: where a call that hangs was made

    def handles(self, roles: Sequence[str] | None = None) -> dict[Key, Any]:
        """The attached processes of `roles` (None: of every role), by (role, index)."""
        return {key: h for key, h in self._handles.items() if roles is None or key[0] in roles}

    def attach(self, role: str, handles: Sequence[Any]) -> None:
        """The actor handles of a role's processes, in the plan's process order."""
        planned = self.plan.processes[role]
        if len(handles) != len(planned):
            raise ValueError(f"{role}: {len(handles)} handles for {len(planned)} planned processes")
        self._handles.update({(role, i): handle for i, handle in enumerate(handles)})

    def attach_workers(self, workers: dict[str, Any]) -> None:
        """`attach` every role of the pipeline's worker dict (the inference entry is a list, a role
        of several ranks a `RankGroup`: each rank is offloaded and reloaded on its own)."""
        for key, entry in workers.items():
            self.attach(WORKER_ROLES[key], process_handles(entry))

    def enter(self, phase: str) -> None:
        """Make the phase's roles resident, offloading first whoever shares their devices."""
        self.phase = phase
        needed = [p for role in PHASE_ROLES[phase] for p in self.plan.processes.get(role, ())]
        needed_keys = {(p.role, p.index) for p in needed}
        evict = [
            key
            for key in self._handles
            if key not in needed_keys
            and key not in self.offloaded
            and self._placement(key).device not in self.resident_devices
            and any(_share(self._placement(key), p) for p in needed)
        ]
        restore = [key for key in self._handles if key in needed_keys and key in self.offloaded]
        if evict:
            self._timed("offload", [self._handles[key].offload.remote() for key in evict])
            self.offloaded.update(evict)
        if restore:
            self._timed("reload", [self._handles[key].reload.remote() for key in restore])
            self.offloaded.difference_update(restore)

    def read_memory(self) -> dict[Key, dict[str, float]]:
        """`memory_gib` of every process on a GPU (peaks since the last read); {} when none is."""
        keys = [key for key in self._handles if self._placement(key).device is not None]
        if not keys:
            return {}
        return dict(zip(keys, self._get([self._handles[key].memory_gib.remote() for key in keys]), strict=True))

    def stay_if_room(self, readings: dict[Key, dict[str, float]]) -> list[int]:
        """Stop taking turns on each shared device where the processes fit together (`fits_together`
        on `read_memory`'s readings); returns those devices."""
        by_device: dict[int, list[dict[str, float]]] = {}
        for key, reading in readings.items():
            device = self._placement(key).device
            assert device is not None  # read_memory reads the processes placed on a device only
            by_device.setdefault(device, []).append(reading)
        for device, shared in by_device.items():
            if len(shared) > 1 and fits_together([r["reserved_peak"] for r in shared], shared[0]["total"]):
                self.resident_devices.add(device)
        return sorted(self.resident_devices)

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


def fits_together(reserved_peaks_gib: Sequence[float], total_gib: float) -> bool:
    """Whether processes with these reserved peaks fit on one device of `total_gib` at once, with
    `PROCESS_OVERHEAD_GIB` each and within `ROOM_FRACTION` (False where the size is unknown, 0)."""
    need = sum(reserved_peaks_gib) + PROCESS_OVERHEAD_GIB * len(reserved_peaks_gib)
    return total_gib > 0 and need <= ROOM_FRACTION * total_gib


def _share(a: ProcessPlacement, b: ProcessPlacement) -> bool:
    return a.device is not None and a.device == b.device
