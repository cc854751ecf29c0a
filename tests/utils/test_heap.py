"""Freezing a process's long-lived objects (roll.utils.heap), in this process and in Ray actors."""

from __future__ import annotations

import gc
import sys
import time
import weakref

import pytest
import ray
from ray import cloudpickle

from roll.pipeline import run_setup
from roll.pipeline.run_setup import freeze_heaps
from roll.utils import heap

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/


@pytest.fixture
def unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()  # the test process goes on as before


class Tracked:
    """A tracked object (instances of plain classes are) to look for among the collector's objects."""


def test_freeze_moves_what_lives_now_out_of_every_collection_and_nothing_made_later(unfrozen):
    before = Tracked()
    assert any(o is before for o in gc.get_objects())
    frozen = heap.freeze_heap()
    after = Tracked()
    assert frozen == gc.get_freeze_count() > 0
    assert not any(o is before for o in gc.get_objects())  # a full collection no longer walks it
    assert any(o is after for o in gc.get_objects())
    cycle = [Tracked()]
    cycle.append(cycle)
    del cycle
    assert gc.collect() >= 2  # garbage made after the freeze is still collected


def test_freeze_collects_garbage_first_so_that_none_is_frozen_for_good(unfrozen):
    gc.disable()  # no collection may run on its own before the freeze
    try:
        cycle = [Tracked()]
        cycle.append(cycle)
        alive = weakref.ref(cycle[0])
        del cycle  # unreachable now, but only a collection can free a cycle
        assert alive() is not None
        heap.freeze_heap()
        assert alive() is None  # frozen garbage would never be collected
    finally:
        gc.enable()


@pytest.mark.parametrize(
    ("value", "on"), [(None, True), ("1", True), ("0", False), ("false", False), ("Off", False), ("no", False)]
)
def test_the_switch_is_on_unless_set_to_a_no(monkeypatch, value, on):
    if value is None:
        monkeypatch.delenv(heap.ENV_SWITCH, raising=False)
    else:
        monkeypatch.setenv(heap.ENV_SWITCH, value)
    assert heap.enabled() is on


class Worker:
    def frozen(self) -> int:
        return gc.get_freeze_count()

    def busy(self, seconds: float) -> None:
        time.sleep(seconds)


class Group:
    def __init__(self, handles):
        self.handles = handles


class Rollout:
    def __init__(self, workers):
        self.workers = workers


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    yield
    ray.shutdown()


def test_freeze_heaps_reaches_every_role_and_env_worker_and_the_driver(local_ray, unfrozen, monkeypatch):
    monkeypatch.delenv(heap.ENV_SWITCH, raising=False)
    actor = ray.remote(Worker)
    one, ranks, engines, env_workers = (
        actor.remote(),
        [actor.remote(), actor.remote()],
        [actor.remote()],
        [actor.remote()],
    )
    everyone = [one, *ranks, *engines, *env_workers]
    assert ray.get([a.frozen.remote() for a in everyone]) == [0] * len(everyone)
    workers = {"weight_store": one, "actor": Group(ranks), "inference": engines}
    freeze_heaps(workers, [Rollout(env_workers), None], timeout_s=60)
    assert all(count > 0 for count in ray.get([a.frozen.remote() for a in everyone]))
    assert gc.get_freeze_count() > 0


def test_freeze_heaps_passes_over_a_worker_that_is_gone(local_ray, unfrozen, monkeypatch):
    monkeypatch.delenv(heap.ENV_SWITCH, raising=False)
    alive, gone = ray.remote(Worker).remote(), ray.remote(Worker).remote()
    ray.get([alive.frozen.remote(), gone.frozen.remote()])
    ray.kill(gone, no_restart=True)
    freeze_heaps({"actor": alive}, [Rollout([gone]), Rollout([])], timeout_s=60)
    assert ray.get(alive.frozen.remote()) > 0
    freeze_heaps({}, [], timeout_s=60)  # nothing to reach: the driver only


def test_freeze_heaps_does_not_wait_out_a_busy_worker(local_ray, unfrozen, monkeypatch):
    monkeypatch.delenv(heap.ENV_SWITCH, raising=False)
    idle, busy = ray.remote(Worker).remote(), ray.remote(Worker).remote()
    ray.get([idle.frozen.remote(), busy.frozen.remote()])
    monkeypatch.setattr(run_setup, "FREEZE_WAIT_S", 0.5)
    call = busy.busy.remote(30)
    freeze_heaps({"actor": [idle, busy]}, [], timeout_s=600)  # the run's rpc_timeout: capped
    assert ray.wait([call], timeout=0)[0] == []  # returned while the busy worker was still busy
    assert ray.get(idle.frozen.remote()) > 0
    ray.kill(busy)


def test_freeze_heaps_does_nothing_when_switched_off(local_ray, unfrozen, monkeypatch):
    monkeypatch.setenv(heap.ENV_SWITCH, "0")
    worker = ray.remote(Worker).remote()
    freeze_heaps({"actor": worker}, [], timeout_s=60)
    assert ray.get(worker.frozen.remote()) == 0
    assert gc.get_freeze_count() == 0
