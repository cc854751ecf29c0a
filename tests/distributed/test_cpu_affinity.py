"""Roles on separate cores: the default shares (hand-derived), splitting among processes,
pinning every thread of a process, and `strategy_config.num_threads` / `cpu_affinity` checks."""

import os
import threading

import pytest

from roll.configs.base import InvalidField
from roll.configs.worker import WorkerConfig, check_strategy_for_role, cpu_options, engine_options
from roll.distributed.cpu_affinity import (
    ENV_WORKERS,
    INFERENCE,
    TRAINING,
    CpuShare,
    default_cpu_shares,
    pin_process,
    split_cores,
)


def shares(cores, async_training):
    got = default_cpu_shares(cores, async_training)
    return got[INFERENCE], got[TRAINING], got[ENV_WORKERS]


def test_two_cores_pin_nothing_and_split_threads_only_when_async():
    assert shares([0, 1], async_training=False) == (CpuShare(), CpuShare(), CpuShare())
    assert shares([0, 1], async_training=True) == (CpuShare(None, 1), CpuShare(None, 1), CpuShare())
    assert shares([3], async_training=True) == (CpuShare(), CpuShare(), CpuShare())


def test_more_cores_leave_the_last_to_the_env_workers():
    # 4 cores, async: roles get 0-2, inference 3 // 2 = 1 of them, training the other 2
    assert shares([0, 1, 2, 3], async_training=True) == (CpuShare((0,), 1), CpuShare((1, 2), 2), CpuShare((3,), 1))
    # 8 cores, sync: phases take turns, so both get cores 0-6
    assert shares(range(8), async_training=False) == (
        CpuShare(tuple(range(7)), 7),
        CpuShare(tuple(range(7)), 7),
        CpuShare((7,), 1),
    )
    # 3 cores, async, a mask with gaps: the roles' two cores split one each
    assert shares([5, 2, 9], async_training=True) == (CpuShare((2,), 1), CpuShare((5,), 1), CpuShare((9,), 1))


def test_a_share_splits_into_contiguous_runs_per_process():
    assert split_cores(CpuShare((0, 1, 2, 3), 4), 2) == [CpuShare((0, 1), 2), CpuShare((2, 3), 2)]
    assert split_cores(CpuShare((0, 1, 2)), 2) == [CpuShare((0,), 1), CpuShare((1, 2), 2)]
    assert split_cores(CpuShare((4,)), 3) == [CpuShare((4,), 1)] * 3  # more processes than cores
    assert split_cores(CpuShare(None, 4), 2) == [CpuShare(None, 2)] * 2
    assert split_cores(CpuShare(), 2) == [CpuShare()] * 2


def test_pin_process_pins_threads_that_already_run():
    before = os.sched_getaffinity(0)
    core = min(before)
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        pin_process([core])
        assert os.sched_getaffinity(worker.native_id) == {core} and os.sched_getaffinity(0) == {core}
    finally:
        pin_process(before)
        stop.set()
        worker.join()
    assert os.sched_getaffinity(0) == before


def worker(strategy_name="torch", **options) -> WorkerConfig:
    return WorkerConfig(strategy_args={"strategy_name": strategy_name, "strategy_config": options})


def test_cpu_options_are_accepted_by_every_engine_and_never_reach_it():
    ds = worker("deepspeed", zero_optimization={"stage": 1}, num_threads=2, cpu_affinity="list(range(0, 2))")
    check_strategy_for_role("actor_train", ds)
    assert cpu_options("actor_train", ds) == ([0, 1], 2)
    assert engine_options(ds.strategy_args.strategy_config) == {"zero_optimization": {"stage": 1}}
    check_strategy_for_role("actor_infer", worker("hf", max_batch_size=8, cpu_affinity=[1]))
    assert cpu_options("critic", worker()) == (None, None)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"num_threads": 0}, "actor_train.strategy_args.strategy_config.num_threads: must be an integer >= 1 (got 0)"),
        ({"num_threads": True}, "num_threads: must be an integer >= 1 (got True)"),
        ({"num_threads": "2"}, "num_threads: must be an integer >= 1 (got '2')"),
        ({"cpu_affinity": []}, "actor_train.strategy_args.strategy_config.cpu_affinity: must be a non-empty list"),
        ({"cpu_affinity": [0, 0]}, "cpu_affinity: must be a non-empty list of distinct core ids"),
        ({"cpu_affinity": [-1]}, "cpu_affinity: must be a non-empty list of distinct core ids"),
        (
            {"cpu_affinity": "0-3"},
            "cpu_affinity: must be a non-empty list of distinct core ids >= 0 or 'list(range(a, b))' (got '0-3')",
        ),
        ({"num_thread": 2}, "actor_train.strategy_args.strategy_config.num_thread: not an option of strategy 'torch'"),
    ],
)
def test_bad_cpu_options_name_the_key(options, message):
    with pytest.raises(InvalidField) as err:
        check_strategy_for_role("actor_train", worker(**options))
    assert message in str(err.value)


def test_cores_the_machine_lacks_are_refused_before_start():
    from roll.pipeline.checks.config import check_cpu_affinity

    check_cpu_affinity("actor_infer", worker("hf", cpu_affinity=sorted(os.sched_getaffinity(0))))
    missing = max(os.sched_getaffinity(0)) + 1
    with pytest.raises(
        InvalidField,
        match=rf"actor_infer.strategy_args.strategy_config.cpu_affinity: core\(s\) "
        rf"\[{missing}\] are not usable here",
    ):
        check_cpu_affinity("actor_infer", worker("hf", cpu_affinity=[missing]))


def test_a_roles_own_options_win_over_the_default(monkeypatch):
    from types import SimpleNamespace

    from roll.pipeline.setup import cpu_shares

    monkeypatch.setattr(cpu_shares.cluster, "joined", lambda: False)
    cfg = SimpleNamespace(
        actor_infer=worker("hf", cpu_affinity=[2, 3]),
        actor_train=worker(num_threads=3),
        critic=worker(),
        async_generation_ratio=1,
        steps_ahead=1,
        device_layout={"mappings": {"actor_train": None, "actor_infer": None}},
    )
    cores = (0, 1, 2, 3)
    assert cpu_shares.role_share(cfg, "actor_infer", cores) == CpuShare((2, 3), 2)
    assert cpu_shares.role_share(cfg, "actor_train", cores) == CpuShare(None, 3)
    assert cpu_shares.role_share(cfg, "critic", cores) == CpuShare((1, 2), 2)  # the async default
    assert cpu_shares.role_share(cfg, ENV_WORKERS, cores) == CpuShare((3,), 1)
    cfg.device_layout["mappings"]["actor_train"] = [0]  # a GPU run: no default pinning
    assert cpu_shares.role_share(cfg, "critic", cores) == CpuShare()


def test_score_passes_take_turns_only_where_roles_share_cpu_cores(monkeypatch):
    from types import SimpleNamespace

    from roll.pipeline.setup import cpu_shares

    monkeypatch.setattr(cpu_shares.cluster, "joined", lambda: False)
    monkeypatch.delenv(cpu_shares.SCORE_SWITCH, raising=False)
    cfg = SimpleNamespace(
        actor_train=worker(),
        reference=worker("hf_infer"),
        async_generation_ratio=0,
        steps_ahead=0,
        device_layout={"mappings": {"actor_train": None, "actor_infer": None}},
    )
    roles, cores = ["actor_train", "reference"], (0, 1, 2, 3)
    assert cpu_shares.score_in_turns(cfg, roles, cores)  # both default to every role core
    assert cpu_shares.score_in_turns(cfg, roles, (0, 1))  # 2 cores: nothing pinned, both use all
    assert not cpu_shares.score_in_turns(cfg, ["actor_train"], cores)  # one pass: nothing to order
    cfg.reference = worker("hf_infer", cpu_affinity=[2, 3])
    cfg.actor_train = worker(cpu_affinity=[0, 1])
    assert not cpu_shares.score_in_turns(cfg, roles, cores)  # pinned apart: at once
    cfg.actor_train = worker(cpu_affinity=[1, 2])
    assert cpu_shares.score_in_turns(cfg, roles, cores)  # 4 threads on cores 1-3
    cfg.actor_train, cfg.reference = worker(num_threads=2), worker("hf_infer", num_threads=2)
    assert not cpu_shares.score_in_turns(cfg, roles, cores)  # 2 + 2 threads on 4 cores
    assert cpu_shares.score_in_turns(cfg, roles, (0, 1, 2))
    monkeypatch.setenv(cpu_shares.SCORE_SWITCH, "0")
    assert not cpu_shares.score_in_turns(cfg, roles, cores)
    monkeypatch.delenv(cpu_shares.SCORE_SWITCH)
    cfg.device_layout["mappings"]["actor_train"] = [0]  # a GPU run: the GPU roles' passes overlap
    assert not cpu_shares.score_in_turns(cfg, roles, cores)
    monkeypatch.setattr(cpu_shares.cluster, "joined", lambda: True)
    cfg.device_layout["mappings"]["actor_train"] = None
    assert not cpu_shares.score_in_turns(cfg, roles, cores)  # a cluster: roles may be on other nodes


def test_call_all_starts_each_call_after_the_last_returned_only_in_turns():
    import time

    import ray

    from roll.pipeline.setup.cpu_shares import call_all

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")

    @ray.remote
    def interval(delay: float) -> tuple[float, float]:
        start = time.time()
        time.sleep(delay)
        return start, time.time()

    try:
        ray.get([interval.remote(0.0), interval.remote(0.0)])  # both workers started before timing
        calls = {"a": lambda: interval.remote(2.0), "b": lambda: interval.remote(2.0)}
        (_, a_end), (b_start, _) = call_all(calls, in_turns=True, timeout_s=60).values()
        assert b_start >= a_end
        (_, a_end), (b_start, _) = call_all(calls, in_turns=False, timeout_s=60).values()
        assert b_start < a_end
    finally:
        ray.shutdown()
