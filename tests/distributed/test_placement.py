"""`device_mapping` placement against hand-written layouts: which device each process takes, what
Ray is asked for, which roles are colocated, and a one-line error naming the key for every layout
that cannot run. Pure logic: the GPU counts are given, no GPU is needed."""

from __future__ import annotations

import pytest

from roll.configs.worker import parse_device_mapping
from roll.distributed.placement import (
    DevicePlan,
    PlacementError,
    ProcessPlacement,
    check_device_layout,
    plan_devices,
)

TORCH = {"actor_train": "torch", "critic": "torch", "reference": "torch", "actor_infer": "hf"}


def plan(mappings, replicas=1, gpus=8, driver_visible=None) -> DevicePlan:
    check_device_layout(mappings, strategies=TORCH, inference_replicas=replicas)
    return plan_devices(
        mappings,
        strategies=TORCH,
        inference_replicas=replicas,
        visible_gpus=gpus,
        driver_visible_devices=driver_visible,
    )


def devices_by_process(p: DevicePlan) -> dict[str, list]:
    return {
        role: [(q.index, q.device, q.cuda_visible_devices, q.torch_device) for q in procs]
        for role, procs in p.processes.items()
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("list(range(0,8))", list(range(8))),
        ("list(range(4))", [0, 1, 2, 3]),
        (" list( range(2, 8, 2) ) ", [2, 4, 6]),
        ([3, 1], [3, 1]),
        (None, None),
    ],
)
def test_roll_range_strings_are_parsed_not_evaluated(text, expected):
    assert parse_device_mapping(text) == expected


def test_other_strings_are_refused():
    with pytest.raises(
        ValueError,
        match=r"expected a list of GPU indices, null, or 'list\(range\(a, b\)\)' "
        r"\(got '__import__\(\"os\"\)'\)",
    ):
        parse_device_mapping('__import__("os")')


def test_cpu_run_has_cpu_processes_and_asks_ray_for_nothing():
    p = plan({"actor_train": None, "actor_infer": None, "reference": None}, replicas=3, gpus=0)
    assert devices_by_process(p) == {
        "actor_train": [(0, None, None, "cpu")],
        "actor_infer": [(0, None, None, "cpu"), (1, None, None, "cpu"), (2, None, None, "cpu")],
        "reference": [(0, None, None, "cpu")],
    }
    assert p.colocation_groups == [] and not p.is_colocated("actor_infer")
    assert all(q.ray_options() == {} for procs in p.processes.values() for q in procs)


def test_disjoint_layout():
    p = plan({"actor_train": [0], "actor_infer": [1, 2], "reference": [3]}, replicas=2, gpus=4)
    assert devices_by_process(p) == {
        "actor_train": [(0, 0, "0", "cuda:0")],
        "actor_infer": [(0, 1, "1", "cuda:0"), (1, 2, "2", "cuda:0")],
        "reference": [(0, 3, "3", "cuda:0")],
    }
    assert p.colocation_groups == []
    assert p.process("actor_infer", 1).ray_options() == {
        "num_gpus": 0,
        "runtime_env": {"env_vars": {"CUDA_VISIBLE_DEVICES": "2", "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}},
    }


def test_fully_colocated_on_8_gpus():
    """ROLL's colocated layout as far as it is built: the engine on all 8 GPUs (a replica each),
    every training role on GPU 0 with the engine's first replica."""
    p = plan(
        {"actor_train": [0], "actor_infer": parse_device_mapping("list(range(0,8))"), "critic": [0], "reference": [0]},
        replicas=8,
    )
    assert p.devices("actor_infer") == tuple(range(8))
    assert [q.cuda_visible_devices for q in p.processes["actor_infer"]] == [str(i) for i in range(8)]
    assert p.colocation_groups == [("actor_train", "actor_infer", "critic", "reference")]
    assert all(p.is_colocated(role) for role in p.processes)


def test_roll_8gpu_training_layout_runs_a_rank_per_gpu():
    """ROLL's 8-GPU layout: actor_train and reference as 8 data-parallel ranks, one per GPU, every
    GPU shared with an engine replica."""
    layout = {role: list(range(8)) for role in ("actor_train", "actor_infer", "reference")}
    strategies = {**TORCH, "actor_train": "deepspeed"}
    check_device_layout(layout, strategies=strategies, inference_replicas=8)
    p = plan_devices(layout, strategies=strategies, inference_replicas=8, visible_gpus=8)
    assert [(q.index, q.device, q.cuda_visible_devices) for q in p.processes["actor_train"]] == [
        (i, i, str(i)) for i in range(8)
    ]
    assert p.devices("reference") == tuple(range(8))
    assert p.colocation_groups == [("actor_train", "actor_infer", "reference")]


def test_cpu_training_roles_run_world_size_processes():
    strategies = {**TORCH, "actor_train": "fsdp2", "critic": "deepspeed"}
    mappings = {"actor_train": None, "actor_infer": None, "critic": None, "reference": None}
    sizes = {"actor_train": 2, "critic": 3, "reference": 2}
    check_device_layout(mappings, strategies=strategies, inference_replicas=1, world_sizes=sizes)
    p = plan_devices(mappings, strategies=strategies, inference_replicas=1, visible_gpus=0, world_sizes=sizes)
    assert {role: len(procs) for role, procs in p.processes.items()} == {
        "actor_train": 2,
        "actor_infer": 1,
        "critic": 3,
        "reference": 2,
    }
    assert [q.index for q in p.processes["critic"]] == [0, 1, 2] and p.colocation_groups == []


def test_rank_env_names_the_group_and_the_device():
    gpu, cpu = ProcessPlacement("actor_train", 1, 5, "5"), ProcessPlacement("critic", 1, None, None)
    assert gpu.rank_env(2, 29500) == {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
    }  # it sees one GPU: its own
    assert cpu.rank_env(3, 1234)["LOCAL_RANK"] == "1" and cpu.rank_env(3, 1234)["WORLD_SIZE"] == "3"


def test_partial_overlap_groups_are_transitive():
    p = plan({"actor_train": [0], "actor_infer": [0, 1], "critic": [1], "reference": [2]}, replicas=2, gpus=3)
    assert p.colocation_groups == [("actor_train", "actor_infer", "critic")]
    assert not p.is_colocated("reference")
    p = plan({"actor_train": [1], "actor_infer": [0], "critic": [2], "reference": [2]}, gpus=3)
    assert p.colocation_groups == [("critic", "reference")]
    assert not p.is_colocated("actor_infer")


def test_driver_visible_devices_map_indices_to_its_gpus():
    p = plan({"actor_train": [1], "actor_infer": [0, 3]}, replicas=2, gpus=4, driver_visible="4,5, 6,7")
    assert [q.cuda_visible_devices for q in p.processes["actor_infer"]] == ["4", "7"]
    assert p.process("actor_train").cuda_visible_devices == "5"
    assert p.process("actor_train").device == 1  # the user's index, as the driver numbers it


def error(mappings, *, replicas=1, gpus=8, ratio=0, world_sizes=None) -> PlacementError:
    with pytest.raises(PlacementError) as info:
        check_device_layout(
            mappings,
            strategies=TORCH,
            inference_replicas=replicas,
            async_generation_ratio=ratio,
            world_sizes=world_sizes,
        )
        plan_devices(
            mappings, strategies=TORCH, inference_replicas=replicas, visible_gpus=gpus, world_sizes=world_sizes
        )
    return info.value


BAD_LAYOUTS = [
    (
        {"actor_train": [0], "actor_infer": [0]},
        dict(gpus=0),
        "actor_train.device_mapping",
        "[0] needs CUDA GPUs, and none is visible here; use null to run on CPU (or add +profile=cpu_smoke to "
        "shrink the whole config to this machine)",
    ),
    (
        {"actor_train": [0], "actor_infer": [2, 8]},
        dict(replicas=2),
        "actor_infer.device_mapping",
        "GPU 8 does not exist here: 8 GPUs are visible (indices 0-7)",
    ),
    (
        {"actor_train": [0], "actor_infer": [0], "reference": None},
        {},
        "reference.device_mapping",
        "null (CPU) while actor_train.device_mapping lists GPUs; place every role on GPUs or every role on CPU (null)",
    ),
    (
        {"actor_train": [1], "actor_infer": [0, 1]},
        dict(replicas=2, ratio=1),
        "async_generation_ratio",
        "1 needs actor_infer on GPUs of its own, but it shares [1] with actor_train: rollout then runs while "
        "actor_train works, so neither can be offloaded for the other; use 0 or give actor_infer other devices",
    ),
    (
        {"actor_train": [1], "actor_infer": [0], "critic": [0]},
        dict(ratio=2),
        "async_generation_ratio",
        "2 needs actor_infer on GPUs of its own, but it shares [0] with critic: rollout then runs while "
        "critic works, so neither can be offloaded for the other; use 0 or give actor_infer other devices",
    ),
    (
        {"actor_train": [0], "actor_infer": [0, 1, 2, 3]},
        dict(replicas=2),
        "actor_infer.strategy_args.strategy_config.num_replicas",
        "2 replicas for actor_infer.device_mapping [0, 1, 2, 3]; each replica is one process on one device "
        "(tensor parallel is not built): set it to 4 or leave it out",
    ),
    (
        {"actor_train": None, "actor_infer": None},
        dict(replicas=0),
        "actor_infer.strategy_args.strategy_config.num_replicas",
        "must be an integer >= 1 (got 0)",
    ),
    (
        {"actor_train": [0], "actor_infer": [0], "critic": [2, 3]},
        {},
        "critic.strategy_args.strategy_name",
        "'torch' does not average gradients over the 2 ranks of critic (world_size); use deepspeed, fsdp2, "
        "megatron, or one rank",
    ),
    (
        {"actor_train": None, "actor_infer": None},
        dict(world_sizes={"actor_train": 4}),
        "actor_train.strategy_args.strategy_name",
        "'torch' does not average gradients over the 4 ranks of actor_train (world_size); use deepspeed, fsdp2, "
        "megatron, or one rank",
    ),
    (
        {"actor_train": None, "actor_infer": None},
        dict(world_sizes={"actor_infer": 2}),
        "actor_infer.world_size",
        "2 on CPU; the engine's processes are its replicas: set "
        "actor_infer.strategy_args.strategy_config.num_replicas instead",
    ),
]


@pytest.mark.parametrize(
    ("mappings", "kwargs", "key", "reason"), BAD_LAYOUTS, ids=[case[2] + ":" + case[3][:20] for case in BAD_LAYOUTS]
)
def test_every_bad_layout_names_its_key(mappings, kwargs, key, reason):
    err = error(mappings, **kwargs)
    assert (err.key, err.reason) == (key, reason)
    assert str(err) == f"{key}: {reason}"


def test_async_is_fine_when_the_engine_has_its_own_gpus():
    check_device_layout(
        {"actor_train": [0], "actor_infer": [1], "reference": [0]},
        strategies=TORCH,
        inference_replicas=1,
        async_generation_ratio=2,
    )


def test_ray_options_of_a_cpu_process_are_empty():
    assert ProcessPlacement("actor_train", 0, None, None).ray_options() == {}
