"""`megatron` training strategy: selected by config, not built yet.

What was measured on the CPU machines this project is developed on: megatron-core 0.16.1
installs and builds a `GPTModel` on CPU, but its forward asserts CUDA, so nothing of a Megatron
step can run or be tested here. A strategy also needs the HF <-> Megatron weight conversion (tensor
and pipeline parallel layouts) before it can train a `pretrain:` dir and hand weights to the
inference engines. Until a GPU machine can test both, choosing `megatron` stops the run at start-up
with one line that says which of the two requirements is missing, instead of failing mid-run.
"""

from __future__ import annotations

import importlib.util

import torch


def check_megatron_available(device: str | torch.device) -> None:
    """Raise a one-line error: what `megatron` needs here, and that it is not built yet."""
    if importlib.util.find_spec("megatron.core") is None:
        raise ImportError('strategy "megatron" needs megatron-core and a CUDA GPU (pip install megatron-core); '
                          "use deepspeed or fsdp2 for sharded training on this machine")
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        raise RuntimeError('strategy "megatron" needs a CUDA GPU (megatron-core asserts CUDA in forward); '
                           "use deepspeed or fsdp2, which also run on CPU")
    raise NotImplementedError('strategy "megatron" is not built yet (HF <-> Megatron weight conversion is '
                              "missing); use deepspeed or fsdp2")
