"""`device_mapping` over the nodes of a Ray cluster, as ROLL numbers them: `num_gpus_per_node` GPUs
per node, device index d is GPU `d % num_gpus_per_node` of GPU node `d // num_gpus_per_node`.

Which node is GPU node k. ROLL takes the nodes with at least `num_gpus_per_node` GPUs (others are
not used) in an order of its own (by CPU count, or the nodes' `NODE_RANK`). Here: the same nodes,
the driver's own node first when it is one of them (so a mapping that fits one node stays where a
local run would put it), then by IP address, then node id: an order a user can work out from
`ray status` / `ray list nodes`, and stable from run to run.

What each process gets: its node (`ProcessPlacement.node_id` / `node_ip`; the builders reserve a
bundle there, `roll.pipeline.setup.builders`) and `CUDA_VISIBLE_DEVICES` = its GPU's index on that node,
as the node's raylet numbers its GPUs (0 .. n-1). A node whose raylet was started under a
`CUDA_VISIBLE_DEVICES` of its own renumbers them, which this plan does not see: start GPU nodes
without it. Colocation works as on one machine: two roles listing the same index share that GPU.

`num_gpus_per_node` unset: the GPU count every GPU node of the cluster has (one count), else a
one-line error asking for it. Everything here is pure: `nodes` is `ray.nodes()`'s list (or a
hand-written one in tests/distributed/test_cluster_plan.py); nothing here talks to Ray.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from roll.distributed.placement import DevicePlan, PlacementError, plan_devices

NUM_GPUS_PER_NODE = "num_gpus_per_node"


@dataclass(frozen=True)
class GpuNode:
    """A node that can hold GPU ranks: its Ray node id, IP and GPU count."""

    node_id: str
    ip: str
    gpus: int


def _alive(nodes: Sequence[Mapping]) -> list[GpuNode]:
    """The alive nodes of `nodes` (`ray.nodes()` rows), each with its GPU count."""
    return [
        GpuNode(n["NodeID"], n["NodeManagerAddress"], int(n.get("Resources", {}).get("GPU", 0)))
        for n in nodes
        if n.get("Alive", True)
    ]


def gpu_nodes(nodes: Sequence[Mapping], per_node: int, driver_node_id: str | None = None) -> list[GpuNode]:
    """The alive nodes of `nodes` (`ray.nodes()` rows) with at least `per_node` GPUs, in GPU-node
    order (module docstring)."""
    found = [n for n in _alive(nodes) if per_node > 0 and n.gpus >= per_node]
    return sorted(found, key=lambda n: (n.node_id != driver_node_id, _ip_order(n.ip), n.node_id))


def _ip_order(ip: str) -> tuple:
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return (2, 0, ip)
    return (address.version, int(address), ip)


def gpus_per_node(nodes: Sequence[Mapping], num_gpus_per_node: int | None) -> int:
    """`num_gpus_per_node` when set, else the one GPU count of the cluster's GPU nodes."""
    if num_gpus_per_node is not None:
        return num_gpus_per_node
    counts = sorted({n.gpus for n in _alive(nodes)} - {0})
    if len(counts) > 1:
        raise PlacementError(
            NUM_GPUS_PER_NODE,
            f"unset, and the cluster's GPU nodes differ ({', '.join(map(str, counts))} "
            "GPUs): set it to the GPUs of the nodes device_mapping counts in",
        )
    return counts[0] if counts else 0


def plan_cluster_devices(
    mappings: Mapping[str, list[int] | None],
    *,
    strategies: Mapping[str, str],
    inference_replicas: int,
    nodes: Sequence[Mapping],
    num_gpus_per_node: int | None = None,
    driver_node_id: str | None = None,
    world_sizes: Mapping[str, int] | None = None,
    address: str = "the cluster",
) -> DevicePlan:
    """Every process of every role in `mappings` (as `plan_devices`), each GPU process on its node
    of the cluster `nodes`; `PlacementError` naming the key when the cluster has too few GPU nodes
    for an index, or no GPU at all. CPU roles are left to Ray's scheduler (no node here)."""
    gpu_roles = {role: devices for role, devices in mappings.items() if devices}
    if not gpu_roles:
        return plan_devices(
            mappings,
            strategies=strategies,
            inference_replicas=inference_replicas,
            visible_gpus=0,
            world_sizes=world_sizes,
        )
    per_node = gpus_per_node(nodes, num_gpus_per_node)
    usable = gpu_nodes(nodes, per_node, driver_node_id)
    for role, devices in gpu_roles.items():
        _check_nodes(role, devices, per_node, usable, address)
    plan = plan_devices(
        mappings,
        strategies=strategies,
        inference_replicas=inference_replicas,
        visible_gpus=per_node * len(usable),
        world_sizes=world_sizes,
    )
    processes = {}
    for role, placements in plan.processes.items():
        processes[role] = tuple(
            p
            if p.device is None
            else dataclasses.replace(
                p,
                cuda_visible_devices=str(p.device % per_node),
                node_id=usable[p.device // per_node].node_id,
                node_ip=usable[p.device // per_node].ip,
            )
            for p in placements
        )
    return DevicePlan(processes)


def _check_nodes(role: str, devices: list[int], per_node: int, usable: list[GpuNode], address: str) -> None:
    key = f"{role}.device_mapping"
    if per_node == 0:
        raise PlacementError(
            key,
            f"{devices} needs GPUs, and no node of {address} has one ({NUM_GPUS_PER_NODE}=0); use null to run on CPU",
        )
    needed = max(devices) // per_node + 1
    if needed > len(usable):
        have = ", ".join(n.ip for n in usable) or "none"
        raise PlacementError(
            key,
            f"GPU {max(devices)} is on GPU node {needed - 1} ({NUM_GPUS_PER_NODE}={per_node}: "
            f"index d is GPU d % {per_node} of node d // {per_node}), so the mapping needs {needed} "
            f"nodes with >= {per_node} GPUs; {address} has {len(usable)} ({have})",
        )
