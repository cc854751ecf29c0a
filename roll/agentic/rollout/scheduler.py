"""Rollout scheduler (driver side): hands the pipeline complete groups for one step.

Group j of a step is fully determined by (seed, mode, step, j): its env seed, its tag and its
sampling seeds. Any free env-group slot of the right tag may play it, so a slow group never holds
up a free slot, and the result does not depend on which slot played it. Results come back in
completion order and are returned sorted by j, so the batch is the same run after run.
A group whose every trajectory failed is replaced by a fresh group index (a bounded number of times).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import ray

from roll.agentic.rollout.env_worker import GroupSpec
from roll.agentic.rollout.records import Trajectory
from roll.utils.seeding import derive_seed


@dataclass(frozen=True)
class Slot:
    worker: int  # index into the env-worker handles
    local: int  # slot index inside that worker
    tag: str


class RolloutScheduler:
    def __init__(self, workers: list, slots: list[Slot], seed: int, mode: str, timeout_s: float = 900.0):
        self.workers = workers
        self.slots = slots
        self.seed = seed
        self.mode = mode  # "train": seeds depend on the step; "val": a fixed set every evaluation
        self.timeout_s = timeout_s

    def group_spec(self, step: int, j: int, keep_frames: bool) -> GroupSpec:
        key = (self.seed, self.mode) if self.mode == "val" else (self.seed, self.mode, step)
        return GroupSpec(
            group_index=j, traj_group_id=f"{self.mode}-{step}-{j}" if self.mode != "val" else f"val-{j}",
            env_seed=derive_seed(*key, "env", j), sample_seed=derive_seed(*key, "sample", j),
            keep_frames=keep_frames,
        )

    def tag_of(self, j: int) -> str:
        return self.slots[j % len(self.slots)].tag

    def collect(self, step: int, num_groups: int, keep_frames: bool = False) -> tuple[list[Trajectory], list[str]]:
        """Play `num_groups` groups; return their trajectories (ordered) and the causes of drops."""
        pending = collections.defaultdict(collections.deque)
        for j in range(num_groups):
            pending[self.tag_of(j)].append(j)
        free = collections.defaultdict(collections.deque)
        for slot in self.slots:
            free[slot.tag].append(slot)
        running: dict = {}
        done: dict[int, list[Trajectory]] = {}
        dropped: list[str] = []
        next_index, max_index = num_groups, 2 * num_groups

        def launch() -> None:
            for tag, queue in pending.items():
                while queue and free[tag]:
                    slot, j = free[tag].popleft(), queue.popleft()
                    ref = self.workers[slot.worker].run_group.remote(slot.local, self.group_spec(step, j, keep_frames))
                    running[ref] = slot

        launch()
        while running:
            ready, _ = ray.wait(list(running), num_returns=1, timeout=self.timeout_s)
            if not ready:
                raise TimeoutError(f"rollout: no group finished within {self.timeout_s}s ({self.mode} step {step})")
            slot = running.pop(ready[0])
            free[slot.tag].append(slot)
            result = ray.get(ready[0])
            dropped += result.dropped
            if result.trajectories:
                done[result.group_index] = result.trajectories
            elif next_index < max_index:  # every member failed: play a replacement group
                pending[slot.tag].append(next_index)
                next_index += 1
            else:
                raise RuntimeError(f"rollout: too many failed groups; last causes: {result.dropped[-3:]}")
            launch()
        return [t for j in sorted(done) for t in done[j]], dropped
