"""Idle time, accounted per role and per step: how much of a training step each role spent
computing, syncing, and waiting on the others.

Each worker process keeps a `WorkClock` (roll.distributed.workers.work_clock): cumulative seconds
in its compute calls (training, scoring, generating) and in its sync calls (weights out or in,
moves between device and host). `StepClock.start()` reads every process at the start of a step
and `finish()` again after its weight sync; the difference is what the role did inside the step.
A role of several processes (data-parallel ranks, engine replicas) counts the busiest one.

Per role, with the step's wall time W (`time/step_s`): `time/compute/<role>` + `time/sync/<role>`
+ `time/idle/<role>` = W exactly (readings taken a moment apart are clipped to W); and
`time/idle_fraction` = the roles' idle seconds over their wall seconds (roles x W).
"""

from __future__ import annotations

import time

import ray

from roll.distributed.rank_group import process_handles

ROLES = {"actor": "actor_train", "critic": "critic", "reference": "reference", "inference": "actor_infer"}
"""The pipeline's worker-dict entries whose time is accounted, by the config's role names."""


class StepClock:
    def __init__(self, workers: dict, timeout_s: float):
        self.handles = {role: process_handles(workers[key]) for key, role in ROLES.items() if key in workers}
        self.timeout_s = timeout_s
        self._start = 0.0
        self._before: dict[str, list[dict[str, float]]] = {}

    def start(self) -> None:
        self._before = self._read()
        self._start = time.perf_counter()

    def finish(self) -> dict[str, float]:
        """The step's wall seconds and each role's compute / sync / idle seconds (module docstring)."""
        wall = time.perf_counter() - self._start
        after = self._read()
        metrics = {"time/step_s": wall}
        idle_total = 0.0
        for role, readings in after.items():
            before = self._before.get(role, [])
            compute, sync = _busiest(before, readings)
            compute = min(compute, wall)
            sync = min(sync, wall - compute)
            idle = wall - compute - sync
            metrics.update({f"time/compute/{role}": compute, f"time/sync/{role}": sync, f"time/idle/{role}": idle})
            idle_total += idle
        if after and wall > 0:
            metrics["time/idle_fraction"] = idle_total / (len(after) * wall)
        return metrics

    def _read(self) -> dict[str, list[dict[str, float]]]:
        """Every process's clock, by role; a process that does not answer (restarting) reads as
        nothing, so its role counts no work for the step."""
        refs = {role: [h.work_seconds.remote() for h in handles] for role, handles in self.handles.items()}
        readings: dict[str, list[dict[str, float]]] = {}
        for role, role_refs in refs.items():
            readings[role] = []
            for ref in role_refs:
                try:
                    readings[role].append(ray.get(ref, timeout=self.timeout_s))
                except ray.exceptions.RayActorError:
                    readings[role].append({})
        return readings


def _busiest(before: list[dict[str, float]], after: list[dict[str, float]]) -> tuple[float, float]:
    """(compute, sync) seconds of the process that computed most between the two readings."""
    best = (0.0, 0.0)
    for i, now in enumerate(after):
        then = before[i] if i < len(before) else {}
        if not now or not then:
            continue
        delta = (max(0.0, now["compute"] - then["compute"]), max(0.0, now["sync"] - then["sync"]))
        best = max(best, delta)
    return best
