"""`device_mapping` planned over a cluster's nodes (ROLL's numbering: index d is GPU d % n of node
d // n), against hand-written `ray.nodes()` lists: which node and local GPU each process gets, the
node order, and the one-line refusals naming the key. Pure: no Ray, no GPU."""

from __future__ import annotations

import pytest

from roll.distributed.cluster_plan import gpu_nodes, plan_cluster_devices
from roll.distributed.placement import PlacementError

STRATEGIES = {"actor_train": "fsdp2", "critic": "torch", "reference": "torch", "actor_infer": "hf"}


def node(node_id: str, ip: str, gpus: float, cpus: float = 8, alive: bool = True) -> dict:
    resources = {"CPU": cpus, f"node:{ip}": 1.0, **({"GPU": gpus} if gpus else {})}
    return {"NodeID": node_id, "NodeManagerAddress": ip, "Alive": alive, "Resources": resources}


# listed out of order on purpose: the plan orders them (driver's node first, then by IP)
CLUSTER = [
    node("c" * 8, "10.0.0.10", 2),
    node("h" * 8, "10.0.0.2", 0, cpus=4),
    node("a" * 8, "10.0.0.9", 2),
    node("b" * 8, "10.0.0.3", 2),
    node("d" * 8, "10.0.0.4", 2, alive=False),
]


def plan(mappings, replicas=1, nodes=CLUSTER, per_node=2, driver=None):
    return plan_cluster_devices(
        mappings,
        strategies=STRATEGIES,
        inference_replicas=replicas,
        nodes=nodes,
        num_gpus_per_node=per_node,
        driver_node_id=driver,
        address="10.0.0.2:6379",
    )


def where(p, role):
    return [(q.index, q.device, q.node_ip, q.cuda_visible_devices, q.torch_device) for q in p.processes[role]]


def test_index_d_is_gpu_d_mod_n_of_node_d_div_n_nodes_by_ip_without_gpu_and_dead_nodes():
    # GPU nodes by IP: 10.0.0.3 (node 0), 10.0.0.9 (node 1), 10.0.0.10 (node 2); the head has no
    # GPU and 10.0.0.4 is dead: neither counts
    p = plan({"actor_train": [0, 1, 2], "actor_infer": [4, 5]}, replicas=2)
    assert where(p, "actor_train") == [
        (0, 0, "10.0.0.3", "0", "cuda:0"),
        (1, 1, "10.0.0.3", "1", "cuda:0"),
        (2, 2, "10.0.0.9", "0", "cuda:0"),
    ]
    assert where(p, "actor_infer") == [(0, 4, "10.0.0.10", "0", "cuda:0"), (1, 5, "10.0.0.10", "1", "cuda:0")]
    assert p.process("actor_train", 2).node_id == "a" * 8
    assert p.colocation_groups == []
    # what Ray is asked for is unchanged: no Ray GPU, the process's own CUDA_VISIBLE_DEVICES
    assert p.process("actor_infer", 1).ray_options()["runtime_env"]["env_vars"]["CUDA_VISIBLE_DEVICES"] == "1"


def test_the_drivers_node_is_node_0_when_it_has_the_gpus():
    p = plan({"actor_train": [0], "actor_infer": [2]}, driver="a" * 8)
    assert where(p, "actor_train") == [(0, 0, "10.0.0.9", "0", "cuda:0")]
    assert where(p, "actor_infer") == [(0, 2, "10.0.0.3", "0", "cuda:0")]


def test_shared_indices_are_colocated_across_nodes():
    p = plan({"actor_train": [2, 3], "actor_infer": [3]})
    assert p.colocation_groups == [("actor_train", "actor_infer")]
    assert p.process("actor_infer").node_ip == p.process("actor_train", 1).node_ip == "10.0.0.9"


def test_nodes_with_fewer_gpus_than_num_gpus_per_node_are_not_used():
    nodes = [node("a", "10.0.0.3", 4), node("b", "10.0.0.4", 2), node("c", "10.0.0.5", 8)]
    p = plan({"actor_train": [0, 4], "actor_infer": [7]}, nodes=nodes, per_node=4)
    assert [(q.node_ip, q.cuda_visible_devices) for q in p.processes["actor_train"]] == [
        ("10.0.0.3", "0"),
        ("10.0.0.5", "0"),
    ]
    assert where(p, "actor_infer") == [(0, 7, "10.0.0.5", "3", "cuda:0")]


def test_unset_num_gpus_per_node_is_the_one_gpu_count_of_the_cluster():
    p = plan({"actor_train": [0, 3], "actor_infer": [5]}, per_node=None)
    assert [q.node_ip for q in p.processes["actor_train"]] == ["10.0.0.3", "10.0.0.9"]
    mixed = [node("a", "10.0.0.3", 4), node("b", "10.0.0.4", 2)]
    with pytest.raises(PlacementError) as err:
        plan({"actor_train": [0], "actor_infer": [1]}, nodes=mixed, per_node=None)
    assert err.value.key == "num_gpus_per_node" and "differ (2, 4 GPUs)" in str(err.value)


def test_a_mapping_beyond_the_clusters_gpu_nodes_is_refused_naming_the_key():
    with pytest.raises(PlacementError) as err:
        plan({"actor_train": [0, 1], "actor_infer": [6]})
    assert err.value.key == "actor_infer.device_mapping"
    assert str(err.value) == (
        "actor_infer.device_mapping: GPU 6 is on GPU node 3 (num_gpus_per_node=2: index d is GPU d % 2 of node "
        "d // 2), so the mapping needs 4 nodes with >= 2 GPUs; 10.0.0.2:6379 has 3 (10.0.0.3, 10.0.0.9, 10.0.0.10)"
    )
    assert "\n" not in str(err.value)
    with pytest.raises(PlacementError) as err:  # 4 GPUs per node asked, every node has 2
        plan({"actor_train": [0], "actor_infer": [1]}, per_node=4)
    assert err.value.key == "actor_train.device_mapping" and str(err.value).endswith("has 0 (none)")


def test_a_cluster_without_gpus_refuses_gpu_mappings_and_plans_cpu_roles():
    cpu_only = [node("h", "10.0.0.2", 0), node("w", "10.0.0.3", 0)]
    with pytest.raises(PlacementError) as err:
        plan({"actor_train": [0], "actor_infer": [0]}, nodes=cpu_only, per_node=None)
    assert err.value.key == "actor_train.device_mapping" and "no node of 10.0.0.2:6379 has one" in str(err.value)
    p = plan({"actor_train": None, "actor_infer": None}, nodes=cpu_only, per_node=None)
    assert where(p, "actor_train") == [(0, None, None, None, "cpu")] and where(p, "actor_infer")[0][2] is None


def test_gpu_node_order_is_drivers_node_then_ip_then_id():
    nodes = [node("z", "10.0.0.10", 1), node("y", "10.0.0.9", 1), node("x", "10.0.0.9", 1), node("w", "::1", 1)]
    assert [n.node_id for n in gpu_nodes(nodes, 1)] == ["x", "y", "z", "w"]
    assert [n.node_id for n in gpu_nodes(nodes, 1, driver_node_id="z")] == ["z", "x", "y", "w"]
