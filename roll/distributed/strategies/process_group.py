"""The torch.distributed process group that DeepSpeed and FSDP2 need, even for one process.

A worker started by Ray is not started by `torchrun`, so nothing has set RANK / WORLD_SIZE /
MASTER_ADDR / MASTER_PORT. `ensure_process_group` starts a one-process group (a `file://` store,
gloo on loopback: no socket outside 127.0.0.1) when they are absent, and joins the group they describe when a
launcher did set them (the
two-process test starts its ranks that way, and `roll.pipeline.setup.builders` the ranks of a role with
`world_size` > 1, through `ProcessPlacement.rank_env`). gloo on CPU, nccl on CUDA.
"""

from __future__ import annotations

import os
import socket
import tempfile
import uuid

import torch
import torch.distributed as dist

STORE_FILE_ENV = "ROLL_PG_STORE_FILE"
"""A file the ranks of a group meet in instead of rank 0's TCP store, which torch binds on every
interface whatever MASTER_ADDR says: set for groups whose ranks share one machine."""


STORE_PREFIX = "roll-pg-"


def fresh_store_file() -> str:
    """A path no group has used, for a `file://` rendezvous, named after the process that made it.

    torch removes the file when the group's last member destroys the group; a member killed first
    (a worker ended by its driver) leaves it behind, so each call first removes the files of
    processes that are gone (`remove_stale_store_files`)."""
    remove_stale_store_files()
    return os.path.join(tempfile.gettempdir(), f"{STORE_PREFIX}{os.getpid()}-{uuid.uuid4().hex}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def remove_stale_store_files(directory: str | None = None) -> list[str]:
    """Delete the rendezvous files in `directory` (the temp dir) whose maker process has ended;
    returns their paths. A file of a living process, or a name not of this form, is kept."""
    directory = directory or tempfile.gettempdir()
    removed = []
    for name in os.listdir(directory):
        pid = name[len(STORE_PREFIX) :].split("-", 1)[0] if name.startswith(STORE_PREFIX) else ""
        if not pid.isdigit() or _alive(int(pid)):
            continue
        path = os.path.join(directory, name)
        try:
            os.remove(path)
        except FileNotFoundError:  # another process's sweep got there first
            continue
        removed.append(path)
    return removed


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def node_rendezvous_point() -> tuple[str, int]:
    """This node's address as Ray knows it and a port free on it: where rank 0 of a group that
    runs here serves the group (`roll.pipeline.setup.builders`); 127.0.0.1 on a private local Ray."""
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
    import ray

    name = _interface_of(ray.util.get_node_ip_address() if ray.is_initialized() else os.environ["MASTER_ADDR"])
    if name is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = name


def _interface_of(ip: str) -> str | None:
    import psutil

    return next(
        (name for name, addresses in psutil.net_if_addrs().items() if any(a.address == ip for a in addresses)), None
    )


def ensure_process_group(device: torch.device) -> tuple[int, int]:
    """Initialise the default process group once per process; returns (rank, world_size).

    With a launcher's variables (MASTER_ADDR and MASTER_PORT set) the group is theirs. Without,
    a one-process group in a fresh store file, given to `init_process_group` directly rather
    than through the environment: the environment is inherited by every process this one starts
    (a test's CLI run, Ray workers), and a child that found MASTER_PORT there would try to serve
    a group on a port this process already holds.
    """
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
            if backend == "gloo":
                _gloo_on_node_interface()
            if os.environ.get(STORE_FILE_ENV):  # ranks on one machine: no TCP store
                dist.init_process_group(
                    backend,
                    init_method=f"file://{os.environ[STORE_FILE_ENV]}",
                    rank=int(os.environ["RANK"]),
                    world_size=int(os.environ["WORLD_SIZE"]),
                )
            else:
                dist.init_process_group(backend)
        else:
            if backend == "gloo":
                os.environ.setdefault("GLOO_SOCKET_IFNAME", _interface_of("127.0.0.1") or "lo")
            dist.init_process_group(backend, init_method=f"file://{fresh_store_file()}", rank=0, world_size=1)
    rank = dist.get_rank()
    # DeepSpeed reads LOCAL_RANK from the environment, also when someone else started the group
    # (vLLM in the same process does); harmless to inherit: it names this host's first device.
    os.environ.setdefault("LOCAL_RANK", str(rank))
    return rank, dist.get_world_size()
