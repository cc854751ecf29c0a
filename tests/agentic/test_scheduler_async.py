"""Async rollout: the RolloutScheduler with groups dispatched ahead, and per-request timeouts.

The scheduler is driven through a scripted env worker (a real Ray actor) that stamps each turn
with the version of the weights it "serves": a scripted group has two turns per trajectory, the
version is read at each, and with `hold` the second turn waits until the test calls `release`, so
a weight update can land in between. The timeout test runs a real EnvWorker in-process against an
inference handle whose first generate call never answers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
import threading
import time

import pytest
import ray
from ray import cloudpickle

from envs.frozen_lake.env import FrozenLakeEnv
from roll.agentic.episode import EnvSpec
from roll.agentic.rollout.env_worker import EnvWorker
from roll.agentic.rollout.hang_watch import HangWatch
from roll.agentic.rollout.scheduler import RolloutScheduler, Slot
from roll.core.errors import EngineFailed, EngineHung
from roll.core.records import (
    GenerateOutput,
    GroupResult,
    SamplingParams,
    StepRecord,
    Trajectory,
)
from roll.models.loading import load_tokenizer
from roll.models.tiny import build_tiny_model
from roll.pipeline.phases.batch import staleness_metrics

pytestmark = pytest.mark.ray
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/


class ScriptedEnvWorker:
    def __init__(self):
        import roll.agentic.rollout.env_worker  # noqa: F401  (its calls' arguments: loaded before any call, as in EnvWorker)

        self.reset()

    def reset(
        self,
        fail_group_ids: tuple[str, ...] = (),
        no_turn_group_ids: tuple[str, ...] = (),
        die_group_ids: tuple[str, ...] = (),
        engine_fails: bool = False,
        slow_group_ids: tuple[str, ...] = (),
        stuck_group_ids: tuple[str, ...] = (),
    ) -> None:
        """A fresh script (one actor serves every test: starting actors is the slow part). A
        restarted actor runs __init__ again, so it forgets `die_group_ids`."""
        self.fail_group_ids, self.no_turn_group_ids = set(fail_group_ids), set(no_turn_group_ids)
        self.die_group_ids = set(die_group_ids)
        self.slow_group_ids = set(slow_group_ids)  # these wait for `release` whatever `hold` says
        self.stuck_group_ids = set(stuck_group_ids)  # these block the event loop: the worker answers nothing
        self.engine_fails = engine_fails  # as the real EnvWorker does when the engine failed
        self.version, self.hold, self.log = 0, False, []
        self.gate = asyncio.Event()

    def set_version(self, version: int) -> None:
        self.version = version

    def set_hold(self, hold: bool) -> None:
        self.hold = hold
        self.gate.clear()

    def release(self) -> None:
        self.gate.set()

    async def ping(self) -> bool:
        return True

    def started(self) -> list[str]:
        return list(self.log)

    async def run_group(self, slot: int, spec) -> GroupResult:
        self.log.append(spec.traj_group_id)
        if spec.traj_group_id in self.die_group_ids:
            os._exit(1)  # the process dies, as with a segfaulting env
        if spec.traj_group_id in self.stuck_group_ids:
            time.sleep(3600)  # a blocking call on the event loop: alive, but stuck
        if self.engine_fails:
            raise EngineFailed("inference engine 'hf' failed: RuntimeError: CPU Generator does not use offset")
        if spec.traj_group_id in self.fail_group_ids:
            return GroupResult(spec.group_index, [], ["scripted failure"] * 2)
        first = self.version
        if self.hold or spec.traj_group_id in self.slow_group_ids:
            await self.gate.wait()
        else:
            await asyncio.sleep(0.01)
        trajs = [
            Trajectory(
                tag="lake",
                traj_group_id=spec.traj_group_id,
                traj_id=f"{spec.traj_group_id}-{m}",
                env_seed=spec.env_seed,
                step_rewards=[0.0, 1.0],
                success=True,
                stop_reason="terminated",
                policy_version=self.version,
                num_actions=2,
                num_valid_actions=2,
                policy_versions=[first, self.version],
            )
            for m in range(2)
        ]
        if spec.traj_group_id in self.no_turn_group_ids:  # e.g. the first prompt was already too long
            trajs = [dataclasses.replace(t, policy_versions=[], policy_version=0, num_actions=0) for t in trajs]
        return GroupResult(spec.group_index, trajs, engine_calls=1, engine_requests=4)


@pytest.fixture(scope="module")
def scripted_worker():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    yield ray.remote(ScriptedEnvWorker).options(num_cpus=0).remote()
    ray.shutdown()


@pytest.fixture
def make_scheduler(scripted_worker):
    def make(
        num_slots: int,
        fail_group_ids: tuple[str, ...] = (),
        no_turn_group_ids: tuple[str, ...] = (),
        slow_group_ids: tuple[str, ...] = (),
    ):
        ray.get(scripted_worker.reset.remote(fail_group_ids, no_turn_group_ids, slow_group_ids=slow_group_ids))
        slots = [Slot(worker=0, local=k, tag="lake") for k in range(num_slots)]
        return RolloutScheduler([scripted_worker], slots, seed=7, mode="train"), scripted_worker

    return make


def wait_started(worker, n: int) -> list[str]:
    while len(started := ray.get(worker.started.remote())) < n:
        time.sleep(0.01)
    return started


def group_ids(trajs) -> list[str]:
    return sorted({t.traj_group_id for t in trajs})


def test_synchronous_collect_plays_each_group_once_in_index_order(make_scheduler):
    scheduler, worker = make_scheduler(2)
    trajs, dropped = scheduler.collect(1, 3, policy_version=0)
    assert [t.traj_id for t in trajs] == [f"train-1-{j}-{m}" for j in range(3) for m in range(2)]
    assert [t.env_seed for t in trajs[::2]] == [scheduler.group_spec(1, j, False).env_seed for j in range(3)]
    assert dropped == [] and scheduler.stale_dropped_groups == 0
    assert (scheduler.engine_calls, scheduler.engine_requests) == (3, 12)  # the results' counts, summed
    assert sorted(ray.get(worker.started.remote())) == ["train-1-0", "train-1-1", "train-1-2"]


def test_groups_dispatched_ahead_generate_across_a_weight_update(make_scheduler):
    scheduler, worker = make_scheduler(2)
    scheduler.collect(1, 2, policy_version=0, max_staleness=1)
    ray.get(worker.set_hold.remote(True))
    scheduler.dispatch(2, 2)
    scheduler.dispatch(2, 2)  # dispatching a step twice plays it once
    assert sorted(wait_started(worker, 4)[2:]) == ["train-2-0", "train-2-1"]  # started before collect(2)
    ray.get(worker.set_version.remote(1))  # "training" finished: the engine serves version 1
    ray.get(worker.release.remote())
    trajs, _ = scheduler.collect(2, 2, policy_version=1, max_staleness=1)
    assert group_ids(trajs) == ["train-2-0", "train-2-1"]
    assert all(t.policy_versions == [0, 1] and t.oldest_policy_version == 0 for t in trajs)
    assert scheduler.stale_dropped_groups == 0 and len(ray.get(worker.started.remote())) == 4


def test_too_stale_groups_are_dropped_and_played_again_with_the_same_identity(make_scheduler):
    scheduler, worker = make_scheduler(2)
    scheduler.collect(1, 2, policy_version=0, max_staleness=1)
    scheduler.dispatch(2, 2)
    wait_started(worker, 4)
    ray.get(worker.set_version.remote(3))  # three updates later: version-0 groups are 3 > 1 behind
    trajs, _ = scheduler.collect(2, 2, policy_version=3, max_staleness=1)
    assert scheduler.stale_dropped_groups == 2
    assert group_ids(trajs) == ["train-2-0", "train-2-1"]
    assert all(t.policy_versions == [3, 3] for t in trajs)
    assert sorted(ray.get(worker.started.remote())[4:]) == ["train-2-0", "train-2-1"]  # played twice each
    # staleness within the bound keeps the group
    scheduler.dispatch(3, 2)
    wait_started(worker, 8)
    ray.get(worker.set_version.remote(4))
    scheduler.collect(3, 2, policy_version=4, max_staleness=1)
    assert scheduler.stale_dropped_groups == 0


def test_each_finished_group_is_examined_for_staleness_once_a_collect(make_scheduler, monkeypatch):
    """The staleness limit holds for the whole collect, so a group kept once is not looked at again
    (re-examining every finished group after each arrival made a step cost groups**2)."""
    examined = []
    original = Trajectory.oldest_policy_version

    def counted(self):
        examined.append(self.traj_id)
        return original.fget(self)

    monkeypatch.setattr(Trajectory, "oldest_policy_version", property(counted))
    scheduler, _ = make_scheduler(2)
    trajs, _ = scheduler.collect(1, 6, policy_version=0, max_staleness=1)
    assert len(trajs) == 12 and scheduler.stale_dropped_groups == 0
    assert sorted(examined) == sorted(t.traj_id for t in trajs)  # 12 looks, not 2 + 4 + ... + 12


def test_a_group_without_generated_turns_is_never_stale(make_scheduler):
    scheduler, worker = make_scheduler(2, no_turn_group_ids=("train-2-0",))
    scheduler.dispatch(2, 2)
    wait_started(worker, 2)
    ray.get(worker.set_version.remote(5))
    trajs, _ = scheduler.collect(2, 2, policy_version=5, max_staleness=1)
    assert scheduler.stale_dropped_groups == 1  # train-2-1 (version 0) only
    assert [t.policy_versions for t in trajs] == [[], [], [5, 5], [5, 5]]


def test_first_done_never_waits_on_the_slowest_group(make_scheduler):
    """Partial rollout: step 1 takes the first two groups to finish, one of them dispatched for step
    2, while its slow group runs on; step 2 then takes it with the other group of step 2. (Two
    groups are slow, so which two finish first does not hang on the order of the fast ones.)"""
    scheduler, worker = make_scheduler(4, slow_group_ids=("train-1-0", "train-2-1"))
    scheduler.dispatch(1, 2)
    scheduler.dispatch(2, 2)  # run ahead
    trajs, _ = scheduler.collect(1, 2, policy_version=0, max_staleness=1, first_done=True)
    assert group_ids(trajs) == ["train-1-1", "train-2-0"]
    ray.get(worker.release.remote())
    trajs, _ = scheduler.collect(2, 2, policy_version=0, max_staleness=1, first_done=True)
    assert group_ids(trajs) == ["train-1-0", "train-2-1"]
    assert scheduler._steps == {} and sorted(wait_started(worker, 4)) == [
        "train-1-0",
        "train-1-1",
        "train-2-0",
        "train-2-1",
    ]  # each played once


def test_first_done_drops_a_carried_over_group_by_its_oldest_token(make_scheduler):
    scheduler, worker = make_scheduler(4, slow_group_ids=("train-1-0",))
    scheduler.dispatch(1, 2)
    scheduler.dispatch(2, 2)
    wait_started(worker, 4)  # every group started on version 0
    trajs, _ = scheduler.collect(1, 2, policy_version=0, max_staleness=1, first_done=True)
    ray.get(worker.set_version.remote(3))
    ray.get(worker.release.remote())
    # at version 3 with limit 1, train-1-0 (begun on 0) and train-2-1 (all 0) are too old: played again
    trajs, _ = scheduler.collect(3, 2, policy_version=3, max_staleness=1, first_done=True)
    assert scheduler.stale_dropped_groups >= 1
    assert all(min(t.policy_versions) >= 2 for t in trajs)


def test_a_restored_ledger_plays_the_owed_groups_once_and_none_collected_before(make_scheduler):
    """Resume of a first-done run: a checkpoint after step 1 keeps the ledger; a fresh scheduler
    (the resumed run) restores it and plays exactly the groups step 1 had not collected: the slow
    group of step 1 (not lost) and the other group of step 2 (train-2-0, collected by step 1, is not
    played twice), under the same identities."""
    scheduler, worker = make_scheduler(4, slow_group_ids=("train-1-0", "train-2-1"))
    scheduler.dispatch(1, 2)
    scheduler.dispatch(2, 2)
    trajs, _ = scheduler.collect(1, 2, policy_version=0, max_staleness=1, first_done=True)
    assert group_ids(trajs) == ["train-1-1", "train-2-0"]
    ledger = json.loads(json.dumps(scheduler.ledger()))  # through the checkpoint's JSON
    assert ledger == [
        {"step": 1, "num_groups": 2, "next_index": 2, "taken": 1, "groups": [[0, "lake"]]},
        {"step": 2, "num_groups": 2, "next_index": 2, "taken": 1, "groups": [[1, "lake"]]},
    ]
    assert scheduler.take_counts() == {
        "dispatched_groups": 4,
        "collected_groups": 2,
        "failed_groups": 0,
        "replayed_groups": 0,
        "rescued_groups": 0,
        "rescue_rounds": 0,
        "outstanding_groups": 2,
    }
    ray.get(worker.release.remote())  # the killed run's groups end; the resumed run starts afresh
    resumed, worker = make_scheduler(4)
    resumed.restore(ledger)
    resumed.dispatch(2, 2)  # the resumed loop's own dispatch of a restored step plays nothing more
    trajs, _ = resumed.collect(2, 2, policy_version=1, max_staleness=1, first_done=True)
    assert group_ids(trajs) == ["train-1-0", "train-2-1"]
    assert [t.env_seed for t in trajs[::2]] == [
        resumed.group_spec(1, 0, False).env_seed,
        resumed.group_spec(2, 1, False).env_seed,
    ]
    assert sorted(ray.get(worker.started.remote())) == ["train-1-0", "train-2-1"] and resumed._steps == {}
    assert resumed.take_counts() == {
        "dispatched_groups": 0,
        "collected_groups": 2,
        "failed_groups": 0,
        "replayed_groups": 2,
        "rescued_groups": 0,
        "rescue_rounds": 0,
        "outstanding_groups": 0,
    }


def test_the_group_ledger_counts_a_failed_group_and_its_replacement(make_scheduler):
    scheduler, _ = make_scheduler(2, fail_group_ids=("train-1-1",))
    scheduler.dispatch(2, 2)  # ahead: outstanding after step 1
    scheduler.collect(1, 2, policy_version=0)
    counts = scheduler.take_counts()
    assert counts == {
        "dispatched_groups": 5,  # 2 + 2 + the replacement train-1-2
        "collected_groups": 2,
        "failed_groups": 1,
        "replayed_groups": 0,
        "rescued_groups": 0,
        "rescue_rounds": 0,
        "outstanding_groups": 2,
    }
    assert [e["groups"] for e in scheduler.ledger()] == [[[0, "lake"], [1, "lake"]]]


def test_staleness_metrics_by_hand():
    def traj(versions):
        return Trajectory(
            tag="lake",
            traj_group_id="g",
            traj_id="t",
            env_seed=0,
            step_rewards=[],
            success=False,
            stop_reason="max_steps",
            policy_version=max(versions, default=0),
            num_actions=len(versions),
            num_valid_actions=0,
            policy_versions=versions,
        )

    # trained weights: version 4. Staleness 4-3=1, 4-2=2, 0 (fresh), 0 (no turn); mixed: [2, 3] only.
    metrics = staleness_metrics([traj([3, 3]), traj([2, 3]), traj([4]), traj([])], policy_version=4)
    assert metrics == {
        "rollout/staleness_mean": 0.75,
        "rollout/staleness_max": 2.0,
        "rollout/mixed_version_trajectories": 0.25,
        "rollout/token_lag_mean": 0.0,  # these have no tokens
    }


def test_token_lags_count_every_generated_token_by_the_version_that_sampled_it():
    """A trajectory-wise episode whose second turn was continued under new weights (partial
    rollout), and a step-wise one: 7 tokens at lags 2, 2, 1, 1, 0 (trajectory) and 1, 0 (steps)."""
    traj_wise = Trajectory(
        tag="lake",
        traj_group_id="g",
        traj_id="a",
        env_seed=0,
        step_rewards=[0.0, 1.0],
        success=True,
        stop_reason="terminated",
        policy_version=5,
        num_actions=2,
        num_valid_actions=2,
        token_ids=[1, 7, 7, 2, 8, 8, 8],
        response_mask=[0, 1, 1, 0, 1, 1, 1],
        infer_logprobs=[0.0] * 7,
        token_versions=[-1, 3, 3, -1, 4, 4, 5],
        policy_versions=[3, 4],
    )
    steps = [StepRecord(0, [1], [7], [-0.1], 0.0, "h", versions=[4]), StepRecord(1, [1], [8], [-0.1], 1.0, "h")]
    step_wise = Trajectory(
        tag="lake",
        traj_group_id="g",
        traj_id="b",
        env_seed=0,
        step_rewards=[0.0, 1.0],
        success=True,
        stop_reason="terminated",
        policy_version=5,
        num_actions=2,
        num_valid_actions=2,
        steps=steps,
        policy_versions=[4, 5],
    )
    metrics = staleness_metrics([traj_wise, step_wise], policy_version=5)
    assert metrics == {
        "rollout/staleness_mean": 1.5,  # oldest tokens: version 3 (lag 2) and 4 (lag 1)
        "rollout/staleness_max": 2.0,
        "rollout/mixed_version_trajectories": 1.0,
        "rollout/token_lag_mean": 7 / 7,  # (2 + 2 + 1 + 1 + 0 + 1 + 0) / 7
        "rollout/tokens_by_version_lag/0": 2 / 7,
        "rollout/tokens_by_version_lag/1": 3 / 7,
        "rollout/tokens_by_version_lag/2": 2 / 7,
    }


def test_the_collected_step_goes_before_groups_dispatched_ahead(make_scheduler):
    scheduler, worker = make_scheduler(1)
    ray.get(worker.set_hold.remote(True))
    scheduler.dispatch(2, 2)  # one slot: train-2-0 runs, train-2-1 waits
    wait_started(worker, 1)
    ray.get(worker.release.remote())
    ray.get(worker.set_hold.remote(False))
    trajs, _ = scheduler.collect(1, 1, policy_version=0)
    assert group_ids(trajs) == ["train-1-0"]
    trajs, _ = scheduler.collect(2, 2, policy_version=0)
    assert group_ids(trajs) == ["train-2-0", "train-2-1"]
    assert ray.get(worker.started.remote()) == ["train-2-0", "train-1-0", "train-2-1"]


def test_a_failed_group_ahead_is_replaced_within_its_own_step(make_scheduler):
    scheduler, _ = make_scheduler(2, fail_group_ids=("train-2-1",))
    scheduler.collect(1, 2, policy_version=0, max_staleness=1)
    scheduler.dispatch(2, 2)
    trajs, dropped = scheduler.collect(2, 2, policy_version=0, max_staleness=1)
    assert group_ids(trajs) == ["train-2-0", "train-2-2"]  # the replacement takes a fresh index
    assert dropped == ["scripted failure"] * 2


def test_validation_replaces_no_failed_group(scripted_worker):
    """The validation set is fixed: a group that failed is counted, never swapped for another map."""
    ray.get(scripted_worker.reset.remote(fail_group_ids=("val-1",)))
    scheduler = RolloutScheduler([scripted_worker], [Slot(0, 0, "lake")], seed=7, mode="val", group_size=2)
    trajs, dropped = scheduler.collect(0, 2)
    assert group_ids(trajs) == ["val-0"] and dropped == ["scripted failure"] * 2
    assert sorted(ray.get(scripted_worker.started.remote())) == ["val-0", "val-1"]


def test_a_group_whose_worker_dies_is_replaced_on_the_restarted_worker(scripted_worker):
    worker = ray.remote(ScriptedEnvWorker).options(num_cpus=0, max_restarts=1).remote()
    ray.get(worker.reset.remote(die_group_ids=("train-1-0",)))
    scheduler = RolloutScheduler([worker], [Slot(0, 0, "lake")], seed=7, mode="train", group_size=2)
    trajs, dropped = scheduler.collect(1, 2)
    assert group_ids(trajs) == ["train-1-1", "train-1-2"]  # the replacement takes a fresh index
    assert (
        dropped == ["env worker 0 died: ActorDiedError"] * 2
        or dropped == ["env worker 0 died: ActorUnavailableError"] * 2
    )


def test_a_stuck_env_worker_is_restarted_and_its_groups_played_again(scripted_worker):
    """Hang detection: a group runs past `hung_timeout_s` on a worker whose event loop is blocked;
    the probe goes unanswered, so the worker is killed for Ray to restart, the group's episodes are
    dropped naming why, and a replacement group is played on the restarted worker."""
    worker = ray.remote(ScriptedEnvWorker).options(num_cpus=0, max_restarts=-1).remote()
    warm_up = RolloutScheduler([worker], [Slot(0, 0, "lake")], seed=7, mode="val")
    ray.get(worker.run_group.remote(0, warm_up.group_spec(1, 0, False)))  # its imports done: it blocks only when stuck
    ray.get(worker.reset.remote(stuck_group_ids=("train-1-0",)))
    scheduler = RolloutScheduler(
        [worker], [Slot(0, 0, "lake")], seed=7, mode="train", group_size=2, hung_timeout_s=6.0, probe_s=15.0
    )
    trajs, dropped = scheduler.collect(1, 2)
    assert len(group_ids(trajs)) == 2 and "train-1-0" not in group_ids(trajs)  # replacements, played in full
    cause = (
        "env worker 0 restarted: group train-1-0 (lake) on env worker 0 has run 6 s and answered no probe "
        "within 3 s (half the bound): stuck, killed for Ray to restart"
    )
    assert dropped[:2] == [cause] * 2  # (a machine loaded enough to stall the restarted worker too adds more)
    assert all(d.startswith("env worker 0 restarted: group train-1-") for d in dropped)


def test_a_slow_group_past_the_deadline_is_logged_and_left_running(make_scheduler, caplog):
    scheduler, worker = make_scheduler(2, slow_group_ids=("train-1-0",))
    scheduler.watch = HangWatch(scheduler.workers, hung_timeout_s=0.5, probe_s=5.0)
    threading.Timer(2.0, lambda: ray.get(worker.release.remote())).start()
    with caplog.at_level("WARNING", logger="roll.agentic.rollout.hang_watch"):
        trajs, dropped = scheduler.collect(1, 2)
    assert group_ids(trajs) == ["train-1-0", "train-1-1"] and dropped == []
    messages = [r.getMessage() for r in caplog.records]  # (a loaded machine may make train-1-1 late too)
    assert any(m.startswith("group train-1-0 (lake) on env worker 0 has run ") for m in messages)
    assert all(m.endswith("(env_monitor.hung_timeout 0.5 s); the worker answers: slow, not stuck") for m in messages)


class SlowToRestart(ScriptedEnvWorker):
    """Takes seconds to come back after its process died, as an env worker importing torch does."""

    def __init__(self):
        if ray.get_runtime_context().was_current_actor_reconstructed:
            time.sleep(5)
        super().__init__()


def test_a_worker_slow_to_restart_gets_no_group_until_it_is_back(scripted_worker):
    worker = ray.remote(SlowToRestart).options(num_cpus=0, max_restarts=1).remote()
    ray.get(worker.reset.remote(die_group_ids=("train-1-0",)))
    scheduler = RolloutScheduler([worker], [Slot(0, 0, "lake")], seed=7, mode="train", group_size=2)
    trajs, dropped = scheduler.collect(1, 1)  # calls to a restarting actor fail at once: none is made
    assert group_ids(trajs) == ["train-1-1"] and len(dropped) == 2  # one group lost, counted once


def test_a_worker_that_cannot_come_back_ends_the_step_with_a_clear_error(scripted_worker):
    worker = ray.remote(ScriptedEnvWorker).options(num_cpus=0).remote()
    ray.get(worker.reset.remote())
    ray.kill(worker, no_restart=True)
    scheduler = RolloutScheduler([worker], [Slot(0, 0, "lake")], seed=7, mode="train", group_size=2)
    with pytest.raises(RuntimeError, match=r"too many failed groups; last causes: \['env worker 0 died"):
        scheduler.collect(1, 2)


class _Method:
    """`handle.method.remote(*args)` of a Ray actor handle, answered in-process."""

    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        return self.fn(*args)


class FirstCallHangsInference:
    """Stands in for the inference worker's handle: the first `generate_many` call never answers
    (a stuck engine, or one stuck request); later calls answer every request with "Left" after
    `answer_s`."""

    def __init__(self, left_id: int, answer_s: float = 0.0):
        self.calls, self.left_id, self.answer_s = 0, left_id, answer_s
        self.generate_many, self.release_sessions = _Method(self._generate_many), _Method(lambda sessions: None)

    async def _generate_many(self, requests):
        self.calls += 1
        if self.calls == 1:
            await asyncio.Event().wait()
        await asyncio.sleep(self.answer_s)
        return [GenerateOutput(r.request_id, [self.left_id], [-0.1], "length", policy_version=0) for r in requests]


def frozen_lake_spec(max_steps: int = 2) -> EnvSpec:
    return EnvSpec(
        tag="FL",
        env_type="frozen_lake",
        env_config={},
        max_steps=max_steps,
        max_tokens_per_step=1,
        response_prefix="<answer>",
    )


def test_an_engine_that_answers_nothing_for_the_generate_timeout_stops_the_run_naming_it(tmp_path):
    """Hang detection: the engine's first call never returns and nothing else is answered, so
    after `generate_timeout_s` the group ends in `EngineHung` (the run stops, as for a failed
    engine) naming the engine and the seconds it was silent."""
    path = build_tiny_model(str(tmp_path / "m"), corpus=["You are P."], seed=3)
    scheduler = RolloutScheduler([], [Slot(0, 0, "FL")], seed=7, mode="train")

    async def play():
        inference = FirstCallHangsInference(load_tokenizer(path).convert_tokens_to_ids("Left"))
        worker = EnvWorker([frozen_lake_spec()], 1, path, inference, SamplingParams(), 4096, generate_timeout_s=0.3)
        await worker.run_group(0, scheduler.group_spec(1, 0, False))

    with pytest.raises(
        EngineHung, match=r"^inference engine 0 \(actor_infer\) answered no generate call for 0\.3\d* s "
    ):
        asyncio.run(play())
    assert issubclass(EngineHung, EngineFailed)  # the scheduler and the CLI stop the run on it


def test_a_request_over_the_timeout_while_the_engine_answers_others_drops_only_its_episode(tmp_path):
    """One request never answered while the engine answers another group's turns: slow, not
    hung. The late episode is dropped with its env tag, id and cause, its env made anew, and the
    slot's next group plays normally."""
    path = build_tiny_model(str(tmp_path / "m"), corpus=["You are P."], seed=3)
    scheduler = RolloutScheduler([], [Slot(0, 0, "FL"), Slot(0, 1, "FL")], seed=7, mode="train")

    async def play():
        inference = FirstCallHangsInference(load_tokenizer(path).convert_tokens_to_ids("Left"), answer_s=0.05)
        spec = frozen_lake_spec(max_steps=8)
        worker = EnvWorker([spec, spec], 1, path, inference, SamplingParams(), 4096, generate_timeout_s=0.3)
        managers = list(worker.groups[0])
        late = asyncio.ensure_future(worker.run_group(0, scheduler.group_spec(1, 0, False)))
        await asyncio.sleep(0.05)  # its first call is in flight, stuck; the other group's are answered
        other = await worker.run_group(1, scheduler.group_spec(1, 1, False))
        late = await late
        renewed = [a is not b for a, b in zip(managers, worker.groups[0])]
        return late, other, renewed, await worker.run_group(0, scheduler.group_spec(1, 2, False))

    late, other, renewed, after = asyncio.run(play())
    assert late.trajectories == []
    assert late.dropped == ["FL train-1-0-0: GenerateTimeout: generate timeout: no answer within 0.3s"]
    assert renewed == [True] and other.dropped == [] and len(other.trajectories) == 1
    assert [t.traj_id for t in after.trajectories] == ["train-1-2-0"] and after.dropped == []


class SecondEnvHangs(FrozenLakeEnv):
    """FrozenLake whose second instance (per `made` count) blocks in `step` until it is closed."""

    made = 0

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        SecondEnvHangs.made += 1
        self.hangs, self.released = SecondEnvHangs.made == 2, threading.Event()

    def _apply(self, action):
        if self.hangs:
            self.released.wait()
        return super()._apply(action)

    def close(self):
        self.released.set()
        super().close()


def test_redundant_envs_complete_a_group_without_waiting_for_a_hung_member(tmp_path):
    """group_size 2 + 1 redundant env: member 1 hangs, members 0 and 2 finish, so the group
    returns at once (far inside the 60 s step timeout) with those two, counts one redundant
    episode, drops nothing, and gives member 1 a fresh env; the next group plays all three."""
    path = build_tiny_model(str(tmp_path / "m"), corpus=["You are P."], seed=3)
    spec = EnvSpec(
        tag="FL",
        env_type=f"{__name__}:SecondEnvHangs",
        env_config={},
        max_steps=2,
        max_tokens_per_step=1,
        response_prefix="<answer>",
    )
    scheduler = RolloutScheduler([], [Slot(0, 0, "FL")], seed=7, mode="train")
    SecondEnvHangs.made = 0

    async def play():
        inference = FirstCallHangsInference(load_tokenizer(path).convert_tokens_to_ids("Left"))
        inference.calls = 1  # every call answers
        worker = EnvWorker([spec], 2, path, inference, SamplingParams(), 4096, redundancy=1)
        hung_env = worker.groups[0][1].env
        started = time.monotonic()
        first = await worker.run_group(0, scheduler.group_spec(1, 0, False))
        elapsed = time.monotonic() - started
        return (
            first,
            elapsed,
            hung_env,
            worker.groups[0][1].env,
            await worker.run_group(0, scheduler.group_spec(1, 1, False)),
        )

    first, elapsed, hung_env, renewed_env, second = asyncio.run(play())
    assert [t.traj_id for t in first.trajectories] == ["train-1-0-0", "train-1-0-2"]
    assert first.redundant == 1 and first.dropped == [] and elapsed < 30
    assert hung_env.released.is_set() and renewed_env is not hung_env and not renewed_env.hangs
    # no member hangs now: whichever two finish first are kept (in member order), one is surplus
    ids = [t.traj_id for t in second.trajectories]
    assert len(ids) == 2 and ids == sorted(ids) and set(ids) <= {"train-1-1-0", "train-1-1-1", "train-1-1-2"}
    assert second.redundant == 1 and second.dropped == []


class CountingInference:
    """Stands in for the inference worker's handle: answers "Left" after a short wait, and counts
    the Ray calls (`generate_many`) and the requests they carry."""

    def __init__(self, left_id: int):
        self.left_id, self.calls, self.requests = left_id, 0, 0
        self.generate_many, self.release_sessions = _Method(self._generate_many), _Method(lambda sessions: None)

    async def _generate_many(self, requests):
        self.calls += 1
        self.requests += len(requests)
        await asyncio.sleep(0.01)
        return [GenerateOutput(r.request_id, [self.left_id], [-0.1], "length", policy_version=0) for r in requests]


@pytest.mark.parametrize("manager_type", ["traj", "step"])
def test_an_env_worker_sends_the_requests_of_a_turn_in_one_call_and_reports_the_count(tmp_path, manager_type):
    """16 envs (2 groups of 8) in one env worker, 4 turns each: the turns' 64 requests go in one
    Ray call per turn (never one per request), and the groups' results report exactly the calls
    and requests the engine saw (the scheduler sums them into `rollout/engine_calls`)."""
    path = build_tiny_model(str(tmp_path / "m"), corpus=["You are P."], seed=3)
    # no holes: an episode that keeps moving left plays its 4 turns unless the goal lies to its left
    spec = EnvSpec(
        tag="FL",
        env_type="frozen_lake",
        env_config={"size": 8, "hole_prob": 0.0, "max_path_length": 20},
        max_steps=4,
        max_tokens_per_step=1,
        response_prefix="<answer>",
    )
    scheduler = RolloutScheduler([], [Slot(0, 0, "FL"), Slot(0, 1, "FL")], seed=7, mode="train")
    inference = CountingInference(load_tokenizer(path).convert_tokens_to_ids("Left"))

    async def play():
        worker = EnvWorker([spec, spec], 8, path, inference, SamplingParams(), 4096, manager_type=manager_type)
        return await asyncio.gather(*(worker.run_group(k, scheduler.group_spec(1, k, False)) for k in range(2)))

    results = asyncio.run(play())
    actions = sum(t.num_actions for r in results for t in r.trajectories)
    assert actions == inference.requests == sum(r.engine_requests for r in results)
    assert sum(r.engine_calls for r in results) == inference.calls
    assert actions > 4 * 8  # most episodes run several turns: a per-request route would make > 32 calls
    assert inference.calls <= 4 + 1  # one call per turn, at most one more where the groups' starts split


class RecordingInference:
    """Stands in for one inference replica's handle: answers "Left" after a short wait (so
    episodes overlap), records which turns it served and which sessions it was told to drop
    (`release_sessions`, as the env worker's batching client sends them)."""

    def __init__(self, left_id: int):
        self.left_id, self.served, self.released = left_id, [], []
        self.generate_many, self.release_sessions = _Method(self._generate_many), _Method(self.released.extend)

    async def _generate_many(self, requests):
        await asyncio.sleep(0.01)
        self.served += [r.request_id for r in requests]
        return [GenerateOutput(r.request_id, [self.left_id], [-0.1], "length", policy_version=0) for r in requests]


@pytest.mark.parametrize("manager_type", ["traj", "step"])
def test_episodes_spread_over_inference_replicas_and_each_stays_on_one(tmp_path, manager_type):
    """`num_replicas: 2`: the env worker's gateway sends each new episode to the less loaded
    replica and every later turn of it to the same one (where its KV is), then releases it there,
    step-wise episodes too: no episode stays pinned once its group is done."""
    path = build_tiny_model(str(tmp_path / "m"), corpus=["You are P."], seed=3)
    spec = EnvSpec(
        tag="FL", env_type="frozen_lake", env_config={}, max_steps=3, max_tokens_per_step=1, response_prefix="<answer>"
    )
    scheduler = RolloutScheduler([], [Slot(0, 0, "FL")], seed=7, mode="train")
    left = load_tokenizer(path).convert_tokens_to_ids("Left")
    replicas = [RecordingInference(left), RecordingInference(left)]

    async def play():
        worker = EnvWorker([spec], 4, path, replicas, SamplingParams(), 4096, manager_type=manager_type)
        result = await worker.run_group(0, scheduler.group_spec(1, 0, False))
        await asyncio.sleep(0.05)  # the releases of one moment go in one call, a window later
        return result, worker._gateway.get_stats()["sticky_sessions"]

    result, pinned = asyncio.run(play())
    assert pinned == 0
    assert len(result.trajectories) == 4 and result.dropped == []
    episodes = [{rid.rpartition("/")[0] for rid in r.served} for r in replicas]
    assert len(episodes[0]) == len(episodes[1]) == 2 and not episodes[0] & episodes[1]  # 2 + 2, disjoint
    for r, mine in zip(replicas, episodes):
        assert sorted(r.released) == sorted(mine)  # each episode's KV dropped where it lived
    assert sum(len(r.served) for r in replicas) == sum(t.num_actions for t in result.trajectories)


def test_a_failed_engine_ends_collect_at_once_with_its_message(scripted_worker):
    """No replacement groups and no waiting on timeouts: the first group that reports the engine's
    failure ends the step with the engine's one-line message (not a Ray traceback)."""
    ray.get(scripted_worker.reset.remote(engine_fails=True))
    scheduler = RolloutScheduler([scripted_worker], [Slot(0, 0, "lake"), Slot(0, 1, "lake")], seed=7, mode="train")
    started = time.monotonic()
    with pytest.raises(EngineFailed) as err:
        scheduler.collect(1, 4)
    assert time.monotonic() - started < 10
    assert len(ray.get(scripted_worker.started.remote())) <= 2  # no replacement group was started
    assert str(err.value) == "inference engine 'hf' failed: RuntimeError: CPU Generator does not use offset"
