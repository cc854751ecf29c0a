"""`megatron` training strategy: the `torch` strategy's step around a megatron-core `GPTModel`.

The role still hands over an HF Llama/Qwen2 causal LM (`pretrain:`). The strategy reads its config
(`megatron_convert.arch_from_hf`), builds megatron-core's `GPTModel` of the same shape
(`megatron_model.build_gpt_model`: local layer spec, torch SDPA as core attention), converts the HF
weights into it (group-interleaved `linear_qkv`, `linear_fc1` = [gate; up]) and lets the HF model
go. Roles call it HF-style through `megatron_model.MegatronCausalLM`, so their loss functions are
unchanged. Weights leave in HF names and shapes (`state_dict`), so inference workers and
checkpoints see an ordinary HF model; `load_state_dict` and `load_checkpoint` take HF weights.
`optimizer.pt` holds Megatron-layout moments (fused qkv and fc1): it resumes this strategy only.

What runs where (megatron-core 0.16.1, torch 2.13 CPU build, measured):
- One process, CPU or GPU: forward, backward, AdamW, LR schedule, clipping, checkpoints. Tested
  on CPU (tests/distributed/test_megatron.py): float32 logits equal the HF model's (bit for bit
  here: SDPA on both sides), PPO steps give the torch strategy's losses, gradient norms and weights,
  checkpoints are HF dirs and resume the optimizer.
- Data parallel over all ranks: each rank trains on its share of a mini-batch; gradients are
  averaged in one all-reduce before clipping. Tested with two CPU ranks against one process
  (tests/distributed/test_megatron_two_ranks.py).
- Tensor parallel: the conversion splits and merges shards (`megatron_convert`), and a TP-2
  `GPTModel` over two CPU processes gives the HF logits and, shard by shard, the HF gradients
  (same test file). Training with it is not built (the ranks of a TP group need the same data,
  clipping a norm over shards, checkpoints a gather), so `tensor_model_parallel_size` or
  `pipeline_model_parallel_size` > 1 and `sequence_parallel` stop at start-up with one line.
Only a GPU can check: the CUDA path (SDPA kernels, bf16 numerics against HF's, nccl), memory, speed.
Not supported, one line at start-up: the critic's value model (`*ForTokenClassification`), models
other than Llama/Qwen2 with SwiGLU and default RoPE, Transformer Engine / FP8, MoE.
"""

from __future__ import annotations

import importlib.util
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from roll.distributed.strategies.megatron_convert import arch_from_hf, hf_to_megatron, megatron_to_hf
from roll.distributed.strategies.process_group import ensure_process_group
from roll.distributed.strategies.torch_train import TorchTrainStrategy, restore_schedule

INSTALL = 'pip install "megatron-core>=0.16,<0.17"'


def check_megatron_available() -> None:
    """Raise a one-line ImportError, with the install line, unless megatron-core 0.16 is installed
    (the version whose core-attention and rotary interfaces megatron_model is written against)."""
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        raise ImportError(f'strategy "megatron" needs megatron-core: {INSTALL}')
    try:
        installed = version("megatron-core")
    except PackageNotFoundError:  # a Megatron-LM checkout on the path: no version to check
        return
    if not installed.startswith("0.16."):
        raise ImportError(f'strategy "megatron" is written against megatron-core 0.16 (found {installed}): {INSTALL}')


def check_parallel_sizes(tensor_model_parallel_size: int = 1, pipeline_model_parallel_size: int = 1,
                         sequence_parallel: bool = False) -> None:
    """A one-line ValueError for the model-parallel layouts that are not built (module docstring)."""
    if tensor_model_parallel_size != 1 or pipeline_model_parallel_size != 1 or sequence_parallel:
        raise ValueError('strategy "megatron" trains with tensor_model_parallel_size = pipeline_model_parallel_size '
                         "= 1 and sequence_parallel = false only; use fsdp2 or deepspeed ZeRO-3 to shard a model")


class MegatronTrainStrategy(TorchTrainStrategy):
    """`TorchTrainStrategy` over a megatron-core `GPTModel` converted from `model` (see module
    docstring); `model` is an HF Llama/Qwen2 `*ForCausalLM` and is not kept."""

    def __init__(self, model: nn.Module, *, tensor_model_parallel_size: int = 1, pipeline_model_parallel_size: int = 1,
                 sequence_parallel: bool = False, device: str | torch.device = "cpu", **kwargs) -> None:
        check_megatron_available()
        check_parallel_sizes(tensor_model_parallel_size, pipeline_model_parallel_size, sequence_parallel)
        if not type(model).__name__.endswith("ForCausalLM"):
            raise ValueError(f'strategy "megatron" trains causal LMs; {type(model).__name__} (a value model?) '
                             "needs torch, deepspeed or fsdp2")
        from roll.distributed.strategies import megatron_model

        device = torch.device(device)
        self.arch = arch_from_hf(model.config)
        self.hf_class, self.hf_config = type(model), model.config
        self.generation_config = getattr(model, "generation_config", None)
        hf_state = model.state_dict()
        self.hf_names = list(hf_state)  # a tied model lists lm_head.weight too; keep HF's names and order
        self.rank, _ = ensure_process_group(device)
        megatron_model.init_model_parallel()
        self.data_parallel_group = megatron_model.parallel_state.get_data_parallel_group()  # all ranks
        self.gpt = megatron_model.build_gpt_model(self.arch, next(model.parameters()).dtype)
        megatron_model.load_megatron_state(self.gpt, hf_to_megatron(hf_state, self.arch))
        del hf_state
        unconverted = sorted(set(self.hf_names) - set(self._hf_weights()))
        if unconverted:  # a weight the conversion does not know would be lost silently
            raise ValueError(f'strategy "megatron" cannot convert {unconverted[0]} of {self.hf_class.__name__}')
        super().__init__(megatron_model.MegatronCausalLM(self.gpt, self.arch.vocab_size), device=device, **kwargs)
        self.dp_rank, self.dp_size = self.rank, dist.get_world_size(self.data_parallel_group)

    # ---- data parallel ------------------------------------------------------------------------
    def _clip_and_step(self, finite: bool) -> tuple[float, bool]:
        return super()._clip_and_step(self._average_gradients(finite))

    def _average_gradients(self, finite: bool) -> bool:
        """Average gradients over the data-parallel ranks (one flat all-reduce), and whether every
        rank's loss was finite: a rank that skipped its backward must not make the others step
        alone, so the skip is decided for all ranks together. Returns at once with one rank."""
        group = self.data_parallel_group
        size = dist.get_world_size(group)
        if size == 1:
            return finite
        all_finite = torch.tensor([float(finite)], device=self.device)
        dist.all_reduce(all_finite, op=dist.ReduceOp.MIN, group=group)
        params = [p for p in self.model.parameters() if p.requires_grad]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params])
        dist.all_reduce(flat, group=group)
        flat /= size
        for param, grad in zip(params, flat.split([p.numel() for p in params]), strict=True):
            param.grad = grad.view_as(param)
        return bool(all_finite.item())

    # ---- weights and checkpoints ------------------------------------------------------------
    def _hf_weights(self) -> dict[str, torch.Tensor]:
        """The model's weights under HF names: views of the parameters, where they are."""
        return megatron_to_hf({k: v for k, v in self.gpt.state_dict().items() if torch.is_tensor(v)}, self.arch)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """HF-named full CPU copies of the weights, in the HF model's key order."""
        hf_state = self._hf_weights()
        return {name: hf_state[name].detach().to("cpu", copy=True).contiguous() for name in self.hf_names}

    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Overwrite the weights from HF-named tensors (optimizer state is left as it is)."""
        from roll.distributed.strategies.megatron_model import load_megatron_state

        load_megatron_state(self.gpt, hf_to_megatron(state_dict, self.arch))

    def save_checkpoint(self, directory: str | Path) -> None:
        """HF model dir of the weights + optimizer.pt (Megatron layout) + scheduler.pt, on rank 0.

        The HF model that writes the dir lives on the meta device: it holds no memory, and
        `save_pretrained` writes the tensors it is given (sharding and tied weights as HF does)."""
        if self.rank != 0:  # every rank holds the whole model
            return
        directory = Path(directory)
        state = self.state_dict()
        directory.mkdir(parents=True, exist_ok=True)
        with torch.device("meta"):
            shell = self.hf_class(self.hf_config)
        if self.generation_config is not None:
            shell.generation_config = self.generation_config
        shell.save_pretrained(directory, state_dict=state)
        torch.save(self.optimizer.state_dict(), directory / "optimizer.pt")
        torch.save(self.scheduler.state_dict(), directory / "scheduler.pt")

    def load_checkpoint(self, directory: str | Path) -> None:
        """Restore weights (through the HF class's `from_pretrained`), optimizer and scheduler."""
        directory = Path(directory)
        saved = self.hf_class.from_pretrained(directory, dtype=next(self.model.parameters()).dtype)
        self.load_state_dict(saved.state_dict())
        del saved
        self.optimizer.load_state_dict(
            torch.load(directory / "optimizer.pt", weights_only=True, map_location=self.device))
        restore_schedule(self.scheduler, torch.load(directory / "scheduler.pt", weights_only=True))
