"""The torch.distributed process group that DeepSpeed and FSDP2 need, even for one process.

A worker started by Ray is not started by `torchrun`, so nothing has set RANK / WORLD_SIZE /
MASTER_ADDR / MASTER_PORT. `ensure_process_group` starts a one-process group on a free loopback
port when they are absent, and joins the group they describe when a launcher did set them (the
two-process test starts its ranks that way, and `roll.pipeline.builders` the ranks of a role with
`world_size` > 1, through `ProcessPlacement.rank_env`). gloo on CPU, nccl on CUDA.
"""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def node_rendezvous_point() -> tuple[str, int]:
    """This node's address as Ray knows it and a port free on it: where rank 0 of a group that
    runs here serves the group (`roll.pipeline.builders`); 127.0.0.1 on a private local Ray."""
    import ray

    ip = ray.util.get_node_ip_address()
    with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET) as sock:
        sock.bind((ip, 0))
        return ip, sock.getsockname()[1]


def _gloo_on_node_interface() -> None:
    """gloo's pairs listen on the interface its hostname resolves to, which is not the node's on a
    cluster node (or in a network namespace) and not loopback on a local run: use the interface
    holding this node's Ray address (127.0.0.1: `lo`), unless GLOO_SOCKET_IFNAME says otherwise."""
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return
    import psutil
    import ray

    ip = ray.util.get_node_ip_address() if ray.is_initialized() else os.environ["MASTER_ADDR"]
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == ip for a in addresses):
            os.environ["GLOO_SOCKET_IFNAME"] = name
            return


def ensure_process_group(device: torch.device) -> tuple[int, int]:
    """Initialise the default process group once per process; returns (rank, world_size).

    With a launcher's variables (MASTER_ADDR and MASTER_PORT set) the group is theirs. Without,
    a one-process group on a free loopback port, given to `init_process_group` directly rather
    than through the environment: the environment is inherited by every process this one starts
    (a test's CLI run, Ray workers), and a child that found MASTER_PORT there would try to serve
    a group on a port this process already holds.
    """
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
            if backend == "gloo":
                _gloo_on_node_interface()
            dist.init_process_group(backend)
        else:
            dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    rank = dist.get_rank()
    # DeepSpeed reads LOCAL_RANK from the environment, also when someone else started the group
    # (vLLM in the same process does); harmless to inherit: it names this host's first device.
    os.environ.setdefault("LOCAL_RANK", str(rank))
    return rank, dist.get_world_size()
