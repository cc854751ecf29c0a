"""Rollout scheduler (driver side): hands the pipeline complete groups for one step.

Group j of a step is fully determined by (seed, mode, step, j): its env seed, its tag and its
sampling seeds. Any free env-group slot of the right tag may play it, and results are returned
sorted by j, so the batch is the same run after run whichever slot played which group. In
training, a group whose every trajectory failed, or whose env worker died, is replaced by a fresh
group index (at most max(8, 2 x the step's groups) times a step); validation replaces nothing.
An `EngineFailed` from an env worker is never replaced around: `collect` raises it at once. With
`rescue_rounds` k, a training group with no successful episode is played again on its env seed,
up to k rounds until one succeeds, the rounds' episodes joining it (docs/algorithms.md).

Async training: `dispatch(step)` queues a later step's groups ahead of time; `collect(step)`, the
only place results are received, returns them. A group whose oldest token is too old
(`max_staleness`) is dropped, counted, and played again under the same identity. With
`first_done` (partial rollout) `collect` takes the first `num_groups` groups to finish among every
step dispatched so far, the oldest steps' first.

Resume: `ledger()` names, by identity, every group dispatched and not yet collected; a checkpoint
keeps it and `restore(ledger)` queues exactly those groups again (`replayed_groups`).
`take_counts()` is the steps' group ledger: every identity dispatched is collected, failed or
still outstanding. Hangs: a group past `hung_timeout_s` has its worker probed, and a silent one
is killed for Ray to restart, its groups played again (`HangWatch`). No group finished within
`timeout_s`: `RolloutFailed`, naming what runs. The page: docs/async.md ("The rollout scheduler").
"""

from __future__ import annotations

import collections
import heapq
import itertools
import time
from dataclasses import dataclass, field, replace

import ray

from roll.agentic.rollout.env_worker import GroupSpec
from roll.agentic.rollout.hang_watch import HangWatch
from roll.core.errors import RunStopped, engine_failure
from roll.core.records import GroupResult, Trajectory
from roll.core.seeding import derive_seed

_REPROBE_S = 0.5
"""Seconds between readiness probes of an env worker that Ray is restarting."""


@dataclass(frozen=True)
class Slot:
    worker: int  # index into the env-worker handles
    local: int  # slot index inside that worker
    tag: str


@dataclass(frozen=True)
class _Run:
    """A group running on a slot: what it is, for which step, since when."""

    slot: Slot
    step: int
    spec: GroupSpec
    started: float

    @property
    def worker(self) -> int:
        return self.slot.worker

    @property
    def tag(self) -> str:
        return self.slot.tag

    @property
    def group_id(self) -> str:
        return self.spec.traj_group_id


class RolloutFailed(RunStopped, RuntimeError):
    """The rollout cannot complete a step: too many groups failed, or none finished in time. The
    CLI prints it as one line and exits 1 (resume from the last checkpoint once it is fixed)."""


@dataclass
class _StepState:
    """The groups of one dispatched step: how many it needs, what came back, why some failed."""

    num_groups: int
    next_index: int  # the index of the next replacement group
    done: dict[int, tuple[str, GroupSpec, GroupResult]]  # group index -> (tag played, spec, result)
    causes: list[str]  # one per dropped trajectory
    redundant: int = 0  # episodes beyond group_size that were stopped or left out
    taken: int = 0  # groups a `first_done` collect has taken (of any step)
    # groups with no success that wait for a rescue round: index -> (tag, spec, the result so far)
    rescuing: dict[int, tuple[str, GroupSpec, GroupResult]] = field(default_factory=dict)


class RolloutScheduler:
    def __init__(
        self,
        workers: list,
        slots: list[Slot],
        seed: int,
        mode: str,
        timeout_s: float = 900.0,
        group_size: int = 1,
        *,
        hung_timeout_s: float | None = None,
        probe_s: float = 10.0,
        rescue_rounds: int = 0,
        rescue_temperature: float | None = None,
    ):
        self.workers = workers
        self.watch = HangWatch(workers, hung_timeout_s, probe_s)  # a group past the bound: its worker probed
        self.group_size = group_size  # trajectories a group owes: what a dead worker's group loses
        self.slots = slots
        self.seed = seed
        self.mode = mode  # "train": seeds depend on the step; "val": a fixed set every evaluation
        self.timeout_s = timeout_s
        self.rescue_rounds = rescue_rounds if mode == "train" else 0  # validation plays its set as it is
        self.rescue_temperature = rescue_temperature  # None: rescue rounds sample as the rollout does
        self.stale_dropped_groups = 0  # groups dropped as too stale by the last `collect`
        self.redundant_trajectories = 0  # episodes of the last `collect`'s groups beyond group_size
        # Ray calls from env workers to inference workers, and the generate requests they carried,
        # reported with the results the last `collect` received (of any step: in async training the
        # calls of groups that run ahead count when their results arrive)
        self.engine_calls = 0
        self.engine_requests = 0
        self._steps: dict[int, _StepState] = {}
        self._pending: dict[str, list] = collections.defaultdict(list)  # tag -> heap of (step, seq, spec)
        self._running: dict[object, _Run] = {}  # ref -> the group it plays
        # an env worker that died is given no group until Ray has restarted it (a call to a restarting
        # actor fails at once, and would burn the step's replacement groups): its readiness probe's
        # ref -> the worker index, and the slots held back meanwhile
        self._recovering: dict = {}
        self._held: dict[int, list[Slot]] = collections.defaultdict(list)
        self._free = self._all_slots_free()
        self._seq = itertools.count()
        # group identities since the last `take_counts`: dispatched (new), collected, failed (every
        # trajectory dropped, replaced by a new identity), replayed (restored from a checkpoint)
        self._counts: collections.Counter[str] = collections.Counter()

    def group_spec(self, step: int, j: int, keep_frames: bool) -> GroupSpec:
        key = (self.seed, self.mode) if self.mode == "val" else (self.seed, self.mode, step)
        return GroupSpec(
            group_index=j,
            traj_group_id=f"{self.mode}-{step}-{j}" if self.mode != "val" else f"val-{j}",
            env_seed=derive_seed(*key, "env", j),
            sample_seed=derive_seed(*key, "sample", j),
            keep_frames=keep_frames,
        )

    def tag_of(self, j: int) -> str:
        return self.slots[j % len(self.slots)].tag

    def dispatch(self, step: int, num_groups: int, keep_frames: bool = False) -> None:
        """Queue the groups of `step` (once; later calls for the same step do nothing) and start
        as many as there are free slots."""
        if step in self._steps:
            return
        self._steps[step] = _StepState(num_groups, num_groups, {}, [])
        for j in range(num_groups):
            self._push(self.tag_of(j), step, self.group_spec(step, j, keep_frames))
        self._counts["dispatched_groups"] += num_groups
        self._launch()

    def ledger(self) -> list[dict]:
        """Each dispatched step that still owes groups: its counters and its groups not yet
        collected (queued, running, or finished and waiting) as `[index, tag]`, in JSON types."""
        owed: dict[int, list[list]] = collections.defaultdict(list)
        for tag, queue in self._pending.items():
            for step, _, spec in queue:
                if not spec.rescue:  # a rescue round's group is owed once, through `rescuing`
                    owed[step].append([spec.group_index, tag])
        for run in self._running.values():
            if not run.spec.rescue:
                owed[run.step].append([run.spec.group_index, run.tag])
        for step, state in self._steps.items():
            owed[step] += [[j, tag] for j, (tag, _, _) in [*state.done.items(), *state.rescuing.items()]]
        return [
            {
                "step": step,
                "num_groups": state.num_groups,
                "next_index": state.next_index,
                "taken": state.taken,
                "groups": sorted(owed[step]),
            }
            for step, state in sorted(self._steps.items())
        ]

    def restore(self, ledger: list[dict]) -> None:
        """Queue again, under their identities, the groups a checkpoint's `ledger()` owed, and start
        them (counted as `replayed_groups`). Before any `dispatch` of this scheduler."""
        for entry in ledger:
            step = entry["step"]
            self._steps[step] = _StepState(entry["num_groups"], entry["next_index"], {}, [], taken=entry["taken"])
            for j, tag in entry["groups"]:
                self._push(tag, step, self.group_spec(step, j, keep_frames=False))
            self._counts["replayed_groups"] += len(entry["groups"])
        self._launch()

    def take_counts(self) -> dict[str, int]:
        """Group identities dispatched, collected, failed and replayed since the last call, and
        those outstanding now (dispatched, not yet collected: what `ledger` names); rescue rounds
        played (`rescue_rounds`) and the groups a rescue round gave their first success."""
        keys = (
            "dispatched_groups",
            "collected_groups",
            "failed_groups",
            "replayed_groups",
            "rescued_groups",
            "rescue_rounds",
        )
        counts = {key: self._counts[key] for key in keys}
        counts["outstanding_groups"] = sum(len(entry["groups"]) for entry in self.ledger())
        self._counts.clear()
        return counts

    def collect(
        self,
        step: int,
        num_groups: int,
        keep_frames: bool = False,
        *,
        policy_version: int | None = None,
        max_staleness: int = 0,
        first_done: bool = False,
    ) -> tuple[list[Trajectory], list[str]]:
        """Play (or finish) the `num_groups` groups of `step`; return their trajectories ordered by
        group index, and the causes of dropped trajectories.

        With `policy_version` (the version the engine serves now) a group whose oldest token is
        more than `max_staleness` versions older is dropped and played again (`stale_dropped_groups`).
        With `first_done`, the first `num_groups` groups to finish of any dispatched step instead
        (`_collect_first_done`).
        """
        self.stale_dropped_groups = 0
        self.engine_calls = self.engine_requests = 0
        if not self._running and not self._recovering:  # nothing in flight: the same slot order every time
            self._free = self._all_slots_free()
        self.dispatch(step, num_groups, keep_frames)
        if first_done:
            return self._collect_first_done(step, num_groups, policy_version, max_staleness)
        state = self._steps[step]
        checked: set[int] = set()  # groups found fresh enough: the limit holds for the whole call
        while True:
            if policy_version is not None:
                self._drop_stale(step, policy_version - max_staleness, checked)
            if len(state.done) == state.num_groups:
                break
            self._receive_one(step)
        del self._steps[step]
        self._counts["collected_groups"] += len(state.done)
        self.redundant_trajectories = state.redundant
        return [t for j in sorted(state.done) for t in state.done[j][2].trajectories], state.causes

    def _collect_first_done(
        self, step: int, num_groups: int, policy_version: int | None, max_staleness: int
    ) -> tuple[list[Trajectory], list[str]]:
        """The first `num_groups` finished groups of the dispatched steps, oldest (step, index)
        first among those ready; the others keep running. Causes and redundant episodes are
        those received since the last collect; a step whose groups are all taken is forgotten."""
        checked: dict[int, set[int]] = collections.defaultdict(set)
        while True:
            if policy_version is not None:
                for s in list(self._steps):
                    self._drop_stale(s, policy_version - max_staleness, checked[s])
            ready = sorted((s, j) for s, state in self._steps.items() for j in state.done)
            if len(ready) >= num_groups:
                break
            self._receive_one(step)
        trajs, causes, self.redundant_trajectories = [], [], 0
        for s, j in ready[:num_groups]:
            state = self._steps[s]
            trajs += state.done.pop(j)[2].trajectories
            state.taken += 1
        self._counts["collected_groups"] += min(num_groups, len(ready))
        for s, state in list(self._steps.items()):
            causes += state.causes
            self.redundant_trajectories += state.redundant
            state.causes, state.redundant = [], 0
            if state.taken >= state.num_groups:
                del self._steps[s]
        return trajs, causes

    def _drop_stale(self, step: int, oldest_allowed: int, checked: set[int]) -> None:
        """Drop and queue again each finished group of `step` not in `checked` that has a turn older
        than `oldest_allowed`; the groups kept join `checked`, so each result is looked at once."""
        state = self._steps[step]
        for j in [j for j in state.done if j not in checked]:
            tag, spec, result = state.done[j]
            versions = [v for t in result.trajectories if (v := t.oldest_policy_version) is not None]
            if min(versions, default=oldest_allowed) < oldest_allowed:
                del state.done[j]
                self.stale_dropped_groups += 1
                self._push(tag, step, spec)  # the same group again, on the current weights
            else:
                checked.add(j)
        self._launch()

    def _receive_one(self, step: int) -> None:
        """Wait for any running group (of any step), record it, and refill the freed slot."""
        deadline = time.monotonic() + self.timeout_s
        while not (ready := ray.wait([*self._running, *self._recovering], num_returns=1, timeout=self._wait_s())[0]):
            if not self.watch.check(self._running) and time.monotonic() >= deadline:
                raise RolloutFailed(self._nothing_finished(step))
        if ready[0] in self._recovering:  # a restarted env worker answers again: its slots are free
            self._back(ready[0])
            return
        run = self._running.pop(ready[0])
        slot, group_step, spec = run.slot, run.step, run.spec
        self.watch.ended(ready[0])
        try:
            result = ray.get(ready[0])
            self._free[slot.tag].append(slot)
        except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as err:
            # the env-worker process died (Ray restarts it), or the node that held the group's result
            cause = self.watch.cause_of_death(slot.worker, err)
            result = GroupResult(spec.group_index, [], [cause] * self.group_size)
            self._hold(slot)
        except ray.exceptions.RayTaskError as err:  # an inference engine failed: stop, say why
            self._free[slot.tag].append(slot)
            failure = engine_failure(err)
            if failure is None:
                raise
            self._settle_running()
            raise failure from None
        self.engine_calls += result.engine_calls
        self.engine_requests += result.engine_requests
        state = self._steps[group_step]
        state.causes += result.dropped
        state.redundant += result.redundant
        if spec.rescue:  # a rescue round's episodes join their group
            tag, first, so_far = state.rescuing.pop(spec.group_index)
            self._counts["rescued_groups"] += any(t.success for t in result.trajectories)
            merged = replace(so_far, trajectories=so_far.trajectories + result.trajectories)
            self._group_ended(state, group_step, tag, first, merged, rounds_played=spec.rescue)
        elif result.trajectories or self.mode == "val":  # validation keeps its fixed set: a loss is only counted
            self._group_ended(state, group_step, slot.tag, spec, result, rounds_played=0)
        elif state.next_index < state.num_groups + max(8, 2 * state.num_groups):  # all failed: a replacement
            self._push(slot.tag, group_step, self.group_spec(group_step, state.next_index, spec.keep_frames))
            state.next_index += 1
            self._counts["failed_groups"] += 1
            self._counts["dispatched_groups"] += 1
        else:
            raise RolloutFailed(f"rollout: too many failed groups; last causes: {result.dropped[-3:]}")
        self._launch()

    def _group_ended(
        self, state: _StepState, step: int, tag: str, spec: GroupSpec, result: GroupResult, rounds_played: int
    ) -> None:
        """`spec`'s group (its episodes so far: `result`) is done, or, with no success among them and
        rescue rounds left, waits for its next rescue round (validation has none left: 0)."""
        if rounds_played < self.rescue_rounds and not any(t.success for t in result.trajectories):
            state.rescuing[spec.group_index] = (tag, spec, result)
            self._push(tag, step, replace(spec, rescue=rounds_played + 1, temperature=self.rescue_temperature))
            self._counts["rescue_rounds"] += 1
        else:
            state.done[spec.group_index] = (tag, spec, result)

    def _wait_s(self) -> float:
        return self.watch.wait_s(self._running, self.timeout_s)

    def _nothing_finished(self, step: int) -> str:
        """The one line of a rollout in which no group finished within `timeout_s`."""
        now = time.monotonic()
        if not self._running:
            return f"rollout: no group finished within {self.timeout_s:g} s ({self.mode} step {step}); none is running"
        oldest = min(self._running.values(), key=lambda run: run.started)
        return (
            f"rollout: no group finished within {self.timeout_s:g} s ({self.mode} step {step}): {len(self._running)} "
            f"running on env workers {sorted({run.worker for run in self._running.values()})}; the oldest, "
            f"{oldest.group_id} ({oldest.tag}) on env worker {oldest.worker}, for {now - oldest.started:.0f} s"
        )

    def _hold(self, slot: Slot) -> None:
        """Keep `slot` out of use until its env worker answers a readiness probe."""
        self._held[slot.worker].append(slot)
        if slot.worker not in self._recovering.values():
            self._recovering[self.workers[slot.worker].ping.remote()] = slot.worker

    def _back(self, probe) -> None:
        """The probed worker is alive again (or for good not: then its groups fail and are counted);
        still restarting (`ActorUnavailableError`), it is probed again after a moment."""
        worker = self._recovering.pop(probe)
        try:
            ray.get(probe)
        except ray.exceptions.ActorUnavailableError:
            time.sleep(_REPROBE_S)
            self._recovering[self.workers[worker].ping.remote()] = worker
            return
        except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError):
            pass
        self.watch.recovered(worker)
        for slot in self._held.pop(worker, []):
            self._free[slot.tag].append(slot)
        self._launch()

    def _settle_running(self, timeout_s: float = 10.0) -> None:
        """Collect the groups still running (they end within moments once the engine has failed),
        so Ray does not print each one's error as an unhandled traceback when the run stops."""
        refs, self._running = list(self._running), {}
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
        for ref in ready:
            try:
                ray.get(ref)
            except Exception:  # the same engine failure, already being reported
                pass

    def _push(self, tag: str, step: int, spec: GroupSpec) -> None:
        heapq.heappush(self._pending[tag], (step, next(self._seq), spec))

    def _launch(self) -> None:
        for tag, queue in self._pending.items():
            while queue and self._free[tag]:
                slot = self._free[tag].popleft()
                step, _, spec = heapq.heappop(queue)
                ref = self.workers[slot.worker].run_group.remote(slot.local, spec)
                self._running[ref] = _Run(slot, step, spec, time.monotonic())

    def _all_slots_free(self) -> dict[str, collections.deque]:
        free: collections.defaultdict[str, collections.deque[Slot]] = collections.defaultdict(collections.deque)
        for slot in self.slots:
            free[slot.tag].append(slot)
        return free
