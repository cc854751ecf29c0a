"""Rescue rounds: a training group with no successful episode is played again on its env seed.

The scheduler is driven through a scripted env worker (a real Ray actor): group `g` succeeds from
the round `succeed_at[g]` on (never if it is not named, at once if it is named with 0), and with
`hold_rescues` a rescue round waits until the test calls `release`.
"""

from __future__ import annotations

import asyncio
import sys
import time

import pytest
import ray
from ray import cloudpickle

from roll.agentic.rollout.env_worker import GroupSpec
from roll.agentic.rollout.scheduler import RolloutScheduler, Slot
from roll.core.records import GroupResult, Trajectory

pytestmark = pytest.mark.ray
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/

MEMBERS = 2  # episodes a round plays


class RescueScriptedWorker:
    def __init__(self):
        import roll.agentic.rollout.env_worker  # noqa: F401  (its calls' arguments, as in EnvWorker)

        self.reset({})

    def reset(self, succeed_at: dict[str, int], hold_rescues: bool = False) -> None:
        self.succeed_at, self.hold_rescues, self.log = succeed_at, hold_rescues, []
        self.episode_temperatures = []
        self.gate = asyncio.Event()

    def release(self) -> None:
        self.gate.set()

    def played(self) -> list[tuple[str, int]]:
        return list(self.log)

    def temperatures(self) -> list[tuple[str, float | None]]:
        """Each episode played, with the temperature its EpisodeSpec asked for."""
        return list(self.episode_temperatures)

    async def ping(self) -> bool:
        return True

    async def run_group(self, slot: int, spec: GroupSpec) -> GroupResult:
        self.log.append((spec.traj_group_id, spec.rescue))
        if spec.rescue and self.hold_rescues:
            await self.gate.wait()
        await asyncio.sleep(0.01)
        first_success = self.succeed_at.get(spec.traj_group_id, -1)
        success = 0 <= first_success <= spec.rescue
        trajs = []
        for m in range(MEMBERS):
            episode = spec.episode(m)
            self.episode_temperatures.append((episode.traj_id, episode.temperature))
            won = success and m == 0  # one member of a successful round reaches the goal
            trajs.append(
                Trajectory(
                    tag="lake",
                    traj_group_id=episode.traj_group_id,
                    traj_id=episode.traj_id,
                    env_seed=episode.env_seed,
                    step_rewards=[0.0, 1.0 if won else 0.0],
                    success=won,
                    stop_reason="terminated",
                    policy_version=0,
                    num_actions=2,
                    num_valid_actions=2,
                    policy_versions=[0, 0],
                    metrics={"sample_seed": float(episode.sample_seed)},
                )
            )
        return GroupResult(spec.group_index, trajs)


@pytest.fixture(scope="module")
def worker():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    yield ray.remote(RescueScriptedWorker).options(num_cpus=0).remote()
    ray.shutdown()


def episode_ids(group: str, rounds: int) -> list[str]:
    """The traj ids of `group`'s episodes when it plays its first round and `rounds` rescue rounds."""
    return [f"{group}-{f'r{r}-' if r else ''}{m}" for r in range(rounds + 1) for m in range(MEMBERS)]


def scheduler_for(
    worker, succeed_at: dict[str, int], rescue_rounds: int, mode: str = "train", hold=False, temperature=None
):
    ray.get(worker.reset.remote(succeed_at, hold))
    slots = [Slot(worker=0, local=k, tag="lake") for k in range(2)]
    return RolloutScheduler(
        [worker], slots, seed=7, mode=mode, rescue_rounds=rescue_rounds, rescue_temperature=temperature
    )


def test_a_group_without_success_gets_a_rescue_round_whose_episodes_join_it(worker):
    # group 0 succeeds at once, group 1 only in its first rescue round, group 2 never
    scheduler = scheduler_for(worker, {"train-1-0": 0, "train-1-1": 1}, rescue_rounds=1)
    trajs, dropped = scheduler.collect(1, 3)
    assert dropped == []
    ids = episode_ids("train-1-0", 0) + episode_ids("train-1-1", 1) + episode_ids("train-1-2", 1)
    assert [t.traj_id for t in trajs] == ids
    assert ids[4:6] == ["train-1-1-r1-0", "train-1-1-r1-1"]  # the helper's spelling of a rescue episode
    assert {t.traj_group_id for t in trajs[2:6]} == {"train-1-1"}  # one group: compared together
    assert [t.success for t in trajs] == [True, False, False, False, True, False, False, False, False, False]
    assert all(t.env_seed == scheduler.group_spec(1, 2, False).env_seed for t in trajs[6:])
    assert len({t.metrics["sample_seed"] for t in trajs}) == len(trajs)  # every episode samples its own way
    counts = scheduler.take_counts()
    assert (counts["rescue_rounds"], counts["rescued_groups"]) == (2, 1)
    assert (counts["dispatched_groups"], counts["collected_groups"]) == (3, 3)  # rounds are not new groups


def test_rescue_rounds_stop_at_the_first_success_or_at_the_limit(worker):
    scheduler = scheduler_for(worker, {"train-1-0": 2}, rescue_rounds=3)
    trajs, _ = scheduler.collect(1, 2)
    assert [t.traj_id for t in trajs] == episode_ids("train-1-0", 2) + episode_ids("train-1-1", 3)
    assert ray.get(worker.played.remote()).count(("train-1-0", 3)) == 0  # succeeded in round 2: no round 3
    counts = scheduler.take_counts()
    assert (counts["rescue_rounds"], counts["rescued_groups"]) == (5, 1)


def test_without_rescue_rounds_or_in_validation_a_failed_group_is_kept_as_played(worker):
    trajs, _ = scheduler_for(worker, {}, rescue_rounds=0).collect(1, 2)
    assert [t.traj_id for t in trajs] == ["train-1-0-0", "train-1-0-1", "train-1-1-0", "train-1-1-1"]
    trajs, _ = scheduler_for(worker, {}, rescue_rounds=2, mode="val").collect(0, 2)
    assert [t.traj_id for t in trajs] == ["val-0-0", "val-0-1", "val-1-0", "val-1-1"]
    assert all(rescue == 0 for _, rescue in ray.get(worker.played.remote()))


def test_a_group_in_its_rescue_round_is_owed_once_and_replayed_from_its_start(worker):
    scheduler = scheduler_for(worker, {"train-1-0": 0}, rescue_rounds=1, hold=True)
    scheduler.dispatch(1, 2)
    for _ in range(2):  # both groups' first rounds come back; group 1 (no success) starts a rescue round
        scheduler._receive_one(1)
    while ("train-1-1", 1) not in ray.get(worker.played.remote()):  # held there until `release`
        time.sleep(0.01)
    ledger = scheduler.ledger()
    assert ledger[0]["groups"] == [[0, "lake"], [1, "lake"]]  # group 1 once, not once per round
    ray.get(worker.release.remote())
    restored = scheduler_for(worker, {"train-1-0": 0}, rescue_rounds=1)
    restored.restore(ledger)
    trajs, _ = restored.collect(1, 2)
    assert [t.traj_id for t in trajs] == episode_ids("train-1-0", 0) + episode_ids("train-1-1", 1)
    assert restored.take_counts()["replayed_groups"] == 2


def test_rescue_episodes_have_their_own_seeds_and_the_same_every_run():
    spec = GroupSpec(group_index=3, traj_group_id="train-5-3", env_seed=11, sample_seed=99)
    rescue = GroupSpec(group_index=3, traj_group_id="train-5-3", env_seed=11, sample_seed=99, rescue=1)
    first = [spec.episode(m) for m in range(4)]
    again = [rescue.episode(m) for m in range(4)]
    assert [e.sample_seed for e in again] == [rescue.episode(m).sample_seed for m in range(4)]
    assert not {e.sample_seed for e in first} & {e.sample_seed for e in again}
    assert {e.env_seed for e in first + again} == {11}
    assert {e.traj_group_id for e in first + again} == {"train-5-3"}
    assert [e.traj_id for e in again] == [f"train-5-3-r1-{m}" for m in range(4)]


def test_rescue_rounds_sample_at_the_rescue_temperature_and_first_rounds_as_the_rollout(worker):
    scheduler = scheduler_for(worker, {"train-1-0": 0}, rescue_rounds=2, temperature=1.7)
    scheduler.collect(1, 2)
    played = dict(ray.get(worker.temperatures.remote()))
    assert (
        played
        == {
            **dict.fromkeys(episode_ids("train-1-0", 0), None),  # succeeded at once: no rescue round
            **dict.fromkeys(episode_ids("train-1-1", 0), None),  # its first round: the rollout's own
            **dict.fromkeys(episode_ids("train-1-1", 2)[MEMBERS:], 1.7),  # both rescue rounds
        }
    )
    scheduler_for(worker, {}, rescue_rounds=1).collect(1, 1)
    assert {t for _, t in ray.get(worker.temperatures.remote())} == {None}  # no key: as the rollout
