"""The torch.distributed process group that DeepSpeed and FSDP2 need, even for one process.

A worker started by Ray is not started by `torchrun`, so nothing has set RANK / WORLD_SIZE /
MASTER_ADDR / MASTER_PORT. `ensure_process_group` fills in a one-process group on a free loopback
port when they are absent, and joins the group they describe when a launcher did set them (the
two-process test starts its ranks that way). gloo on CPU, nccl on CUDA.
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


def ensure_process_group(device: torch.device) -> tuple[int, int]:
    """Initialise the default process group once per process; returns (rank, world_size)."""
    if not dist.is_initialized():
        # each one only if missing: a launcher sets them all, a library may have left some behind
        for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
            os.environ.setdefault(key, value)
        if "MASTER_PORT" not in os.environ:
            os.environ["MASTER_PORT"] = str(free_port())
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    # A group started by someone else (vLLM in the same process starts one) leaves these unset;
    # DeepSpeed reads LOCAL_RANK from the environment.
    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("LOCAL_RANK", str(rank))
    os.environ.setdefault("WORLD_SIZE", str(world_size))
    return rank, world_size
