"""Where each worker process runs: ROLL's `device_mapping`, planned before any process starts.

A role's `device_mapping` lists GPU indices of the driver's node as the driver numbers them
(`null`: CPU; ROLL's `list(range(0, 8))` is accepted). Each process takes one device: `actor_infer`
one replica per listed device, a training role one data-parallel rank per listed device
(`world_size`). Roles whose lists share a device are colocated and take turns on it
(`roll.pipeline.phases.gpu_offload`). A process starts with `CUDA_VISIBLE_DEVICES` set to its own device and
asks Ray for no GPU, so the indices the user wrote are the ones used; on a joined cluster they
count over the cluster's GPU nodes (`roll.distributed.cluster_plan`).

Contract: pure (no torch, no Ray). `check_device_layout` runs at config time, needs no GPU and
refuses a layout that cannot run; `plan_devices` also checks the layout against this machine's
GPUs when the pipeline places its workers.

The semantics in full, and why not Ray's `num_gpus`: docs/devices.md, "Placement, in full".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from roll.core.errors import BadConfig

INFERENCE_ROLE = "actor_infer"
TRAINING_ROLES = ("actor_train", "critic", "reference")
ROLES = ("actor_train", INFERENCE_ROLE, "critic", "reference")
NUM_REPLICAS_KEY = "actor_infer.strategy_args.strategy_config.num_replicas"
AVERAGING_STRATEGIES = ("deepspeed", "fsdp2", "megatron")
"""Training engines that average gradients over data-parallel ranks."""
NOSET_CUDA_VISIBLE_DEVICES = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"


class PlacementError(BadConfig, ValueError):
    """A layout that cannot run; `str()` is one line, "KEY: why", naming the config key at fault."""

    def __init__(self, key: str, reason: str):
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


@dataclass(frozen=True)
class ProcessPlacement:
    """One worker process: its role, its index among the role's processes, and its device."""

    role: str
    index: int
    device: int | None
    """GPU index as the driver sees it; None: CPU."""
    cuda_visible_devices: str | None
    """`CUDA_VISIBLE_DEVICES` of the process (the device's entry in the driver's); None: left alone."""
    node_id: str | None = None
    """On a cluster, the Ray node the GPU is on (`roll.distributed.cluster_plan`); None: the driver's
    node (a local run) or, for a CPU process, wherever Ray puts it."""
    node_ip: str | None = None
    """That node's IP (for messages and placement.json)."""

    @property
    def torch_device(self) -> str:
        """What the process passes to torch: its one visible GPU, or the CPU."""
        return "cpu" if self.device is None else "cuda:0"

    def rank_env(self, world_size: int, master_port: int, master_addr: str = "127.0.0.1") -> dict[str, str]:
        """The torch.distributed variables of this process as rank `index` of its role's group,
        served by rank 0 at `master_addr`, its own node (`roll.pipeline.setup.builders`); `ensure_process_group`
        joins the group they describe. LOCAL_RANK names the process's device among those it sees:
        0 on a GPU (it sees only its own), the rank on CPU."""
        return {
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
            "RANK": str(self.index),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": "0" if self.device is not None else str(self.index),
        }

    def ray_options(self) -> dict[str, Any]:
        """Options for `ray.remote(...).options()`: none on CPU; on a GPU no Ray GPU and the
        process's own `CUDA_VISIBLE_DEVICES` (see the module docstring)."""
        if self.device is None:
            return {}
        env = {"CUDA_VISIBLE_DEVICES": self.cuda_visible_devices, NOSET_CUDA_VISIBLE_DEVICES: "1"}
        return {"num_gpus": 0, "runtime_env": {"env_vars": env}}


@dataclass(frozen=True)
class DevicePlan:
    """The processes of every role the run builds, by role."""

    processes: dict[str, tuple[ProcessPlacement, ...]]

    def devices(self, role: str) -> tuple[int, ...]:
        """The GPUs of a role's processes, in process order; () for a CPU role."""
        return tuple(p.device for p in self.processes.get(role, ()) if p.device is not None)

    def process(self, role: str, index: int = 0) -> ProcessPlacement:
        return self.processes[role][index]

    @property
    def colocation_groups(self) -> list[tuple[str, ...]]:
        """Roles that share devices, directly or through another role (two or more per group),
        in `ROLES` order. Empty when no two roles share a GPU, e.g. in every CPU run."""
        groups: list[set[str]] = []
        for role in (r for r in ROLES if self.devices(r)):
            touching = [g for g in groups if any(set(self.devices(role)) & set(self.devices(o)) for o in g)]
            merged = {role}.union(*touching)
            groups = [g for g in groups if g not in touching] + [merged]
        return [tuple(r for r in ROLES if r in g) for g in groups if len(g) > 1]

    def is_colocated(self, role: str) -> bool:
        """Whether some other role shares one of this role's devices."""
        return any(role in group for group in self.colocation_groups)


def check_device_layout(
    mappings: Mapping[str, list[int] | None],
    *,
    strategies: Mapping[str, str],
    inference_replicas: int,
    world_sizes: Mapping[str, int] | None = None,
    async_generation_ratio: int = 0,
) -> None:
    """The checks that need no GPU, run when the config is validated; `PlacementError` naming the
    key. `mappings`: `device_mapping` of each role the run builds (absent roles left out);
    `world_sizes`: each role's `world_size` (absent: 1)."""
    gpu_roles = [role for role in ROLES if mappings.get(role) is not None]
    cpu_roles = [role for role in ROLES if role in mappings and mappings[role] is None]
    if gpu_roles and cpu_roles:
        raise PlacementError(
            f"{cpu_roles[0]}.device_mapping",
            f"null (CPU) while {gpu_roles[0]}.device_mapping "
            "lists GPUs; place every role on GPUs or every role on CPU (null)",
        )
    _check_processes(mappings, strategies, inference_replicas, world_sizes or {})
    infer = set(mappings.get(INFERENCE_ROLE) or ())
    for role in (r for r in TRAINING_ROLES if mappings.get(r)):
        shared = sorted(infer & set(mappings[role] or ()))
        if async_generation_ratio > 0 and shared:
            raise PlacementError(
                "async_generation_ratio",
                f"{async_generation_ratio} needs actor_infer on GPUs of its own, but it shares {shared} with "
                f"{role}: rollout then runs while {role} works, so neither can be offloaded for the other; "
                "use 0 or give actor_infer other devices",
            )


def _check_processes(
    mappings: Mapping[str, list[int] | None],
    strategies: Mapping[str, str],
    inference_replicas: int,
    world_sizes: Mapping[str, int],
) -> None:
    """One device per process: `num_replicas` devices for actor_infer, one per rank of a training
    role; several ranks only with an engine that averages their gradients."""
    if isinstance(inference_replicas, bool) or not isinstance(inference_replicas, int) or inference_replicas < 1:
        raise PlacementError(NUM_REPLICAS_KEY, f"must be an integer >= 1 (got {inference_replicas!r})")
    infer = mappings.get(INFERENCE_ROLE)
    if infer is not None and len(infer) != inference_replicas:
        raise PlacementError(
            NUM_REPLICAS_KEY,
            f"{inference_replicas} replicas for actor_infer.device_mapping {infer}; each replica is one process "
            f"on one device (tensor parallel is not built): set it to {len(infer)} or leave it out",
        )
    if infer is None and world_sizes.get(INFERENCE_ROLE, 1) > 1:
        raise PlacementError(
            f"{INFERENCE_ROLE}.world_size",
            f"{world_sizes[INFERENCE_ROLE]} on CPU; the engine's "
            f"processes are its replicas: set {NUM_REPLICAS_KEY} instead",
        )
    for role in (r for r in ("actor_train", "critic") if r in mappings):
        strategy, ranks = strategies.get(role, "torch"), _ranks(role, mappings, world_sizes)
        if ranks > 1 and strategy not in AVERAGING_STRATEGIES:
            raise PlacementError(
                f"{role}.strategy_args.strategy_name",
                f"{strategy!r} does not average gradients over the {ranks} ranks of {role} (world_size); "
                f"use {', '.join(AVERAGING_STRATEGIES)}, or one rank",
            )


def _ranks(role: str, mappings: Mapping[str, list[int] | None], world_sizes: Mapping[str, int]) -> int:
    """A training role's processes: one per listed device, else its `world_size` (1 if absent)."""
    devices = mappings.get(role)
    return len(devices) if devices else world_sizes.get(role, 1)


def plan_devices(
    mappings: Mapping[str, list[int] | None],
    *,
    strategies: Mapping[str, str],
    inference_replicas: int,
    visible_gpus: int,
    driver_visible_devices: str | None = None,
    world_sizes: Mapping[str, int] | None = None,
) -> DevicePlan:
    """Every process of every role in `mappings`, checked against this machine: `visible_gpus` is
    the driver's GPU count, `driver_visible_devices` its `CUDA_VISIBLE_DEVICES` (None: unset),
    `world_sizes` the ranks of CPU training roles (absent: 1)."""
    world_sizes = world_sizes or {}
    _check_processes(mappings, strategies, inference_replicas, world_sizes)
    entries = [e.strip() for e in driver_visible_devices.split(",") if e.strip()] if driver_visible_devices else None
    processes = {}
    for role in (r for r in ROLES if r in mappings):
        devices = mappings[role]
        if devices is None:
            count = inference_replicas if role == INFERENCE_ROLE else world_sizes.get(role, 1)
            processes[role] = tuple(ProcessPlacement(role, i, None, None) for i in range(count))
            continue
        _check_visible(role, devices, visible_gpus)
        processes[role] = tuple(
            ProcessPlacement(role, i, d, entries[d] if entries and d < len(entries) else str(d))
            for i, d in enumerate(devices)
        )
    return DevicePlan(processes)


def _check_visible(role: str, devices: list[int], visible_gpus: int) -> None:
    key = f"{role}.device_mapping"
    if visible_gpus == 0:
        raise PlacementError(
            key,
            f"{devices} needs CUDA GPUs, and none is visible here; use null to run on CPU "
            "(or add +profile=cpu_smoke to shrink the whole config to this machine)",
        )
    missing = [d for d in devices if d >= visible_gpus]
    if missing:
        raise PlacementError(
            key, f"GPU {missing[0]} does not exist here: {visible_gpus} GPUs are visible (indices 0-{visible_gpus - 1})"
        )
