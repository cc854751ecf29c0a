"""`megatron` training strategy: the `torch` strategy's step around a megatron-core `GPTModel`.

The role still hands over an HF Llama/Qwen2 causal LM (`pretrain:`). The strategy builds
megatron-core's `GPTModel` of the same shape (`model.build_gpt_model`), converts the HF
weights into it (`convert`) and lets the HF model go. Roles call it HF-style through
`model.MegatronCausalLM`, so their loss functions are unchanged.

Contract: weights leave in HF names and shapes (`state_dict`: merged over tensor- and
pipeline-parallel ranks, LoRA merged in), so inference workers and checkpoints see an ordinary HF
model; `load_state_dict` and `load_checkpoint` take HF weights; the optimizer files hold
Megatron-layout moments and resume this strategy only. Data, tensor and pipeline parallel (a naive
schedule), recompute, LoRA and sequence packing (megatron's thd format, `model.packed_sequences`)
run; expert, context and sequence parallel, models other than
Llama/Qwen2 and the critic's value model stop at start-up with one line naming the key.
`megatron_infer` is accepted as an alias (roll.configs.worker).

What runs where, how each part is tested, and what only a GPU can check: docs/engines/megatron.md.
"""

from __future__ import annotations

import importlib.util
import math
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from roll.distributed.strategies.megatron.convert import (
    EMBEDDING,
    LAYERS_PREFIX,
    OUTPUT,
    arch_from_hf,
    from_stage,
    hf_to_megatron,
    is_tensor_parallel,
    megatron_to_hf,
    merge_tensor_parallel,
    renumber_layers,
    split_tensor_parallel,
    stage_state,
)
from roll.distributed.strategies.megatron.lora import (
    adapter_from_hf,
    adapter_state,
    adapter_to_hf,
    apply_megatron_lora,
    hf_target_modules,
    is_sharded_adapter,
    merge_adapter,
    merged_state,
    split_adapter,
    with_base_layer_names,
)
from roll.distributed.strategies.megatron.parallel import (
    check_parallel_config,
    check_pipeline_stages,
    clip_grad_norm_tensor_parallel_,
    gather_shards,
)
from roll.distributed.strategies.megatron.pipeline import gather_stages, pipeline_links
from roll.distributed.strategies.process_group import ensure_process_group
from roll.distributed.strategies.torch_train import ADAPTER_DIR, TorchTrainStrategy, restore_schedule

if TYPE_CHECKING:
    from transformers import PreTrainedModel

INSTALL = 'pip install "megatron-core>=0.16,<0.17"'


def check_megatron_available() -> None:
    """Raise a one-line ImportError, with the install line, unless megatron-core 0.16 is installed
    (the version whose core-attention and rotary interfaces megatron.model is written against)."""
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        raise ImportError(f'strategy "megatron" needs megatron-core: {INSTALL}')
    try:
        installed = version("megatron-core")
    except PackageNotFoundError:  # a Megatron-LM checkout on the path: no version to check
        return
    if not installed.startswith("0.16."):
        raise ImportError(f'strategy "megatron" is written against megatron-core 0.16 (found {installed}): {INSTALL}')


class MegatronTrainStrategy(TorchTrainStrategy):
    """`TorchTrainStrategy` over a megatron-core `GPTModel` converted from `model` (see module
    docstring); `model` is an HF Llama/Qwen2 `*ForCausalLM` and is not kept. The parallel keys
    are ROLL's (`parallel.check_parallel_config` says which values run). `recompute`
    (gradient checkpointing, `disable_gradient_checkpointing: false`) means
    `recompute_granularity: full` when that key is not set. `lora` ({rank, alpha, target},
    `ModelArgs.lora`): adapters on the targeted layers, the rest frozen (megatron.lora)."""

    takes_old_logprobs = False  # not built or tested for its tensor- and pipeline-parallel steps

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        tensor_model_parallel_size: int = 1,
        pipeline_model_parallel_size: int = 1,
        expert_model_parallel_size: int = 1,
        context_parallel_size: int = 1,
        sequence_parallel: bool = False,
        use_distributed_optimizer: bool = False,
        recompute_granularity: str | None = None,
        num_layers_in_first_pipeline_stage: int | None = None,
        num_layers_in_last_pipeline_stage: int | None = None,
        recompute: bool = False,
        lora: dict | None = None,
        device: str | torch.device = "cpu",
        **kwargs,
    ) -> None:
        if recompute and recompute_granularity is None:
            recompute_granularity = "full"
        check_megatron_available()
        device = torch.device(device)
        self.rank, world_size = ensure_process_group(device)
        check_parallel_config(
            world_size,
            tensor_model_parallel_size,
            pipeline_model_parallel_size,
            expert_model_parallel_size,
            context_parallel_size,
            sequence_parallel,
            use_distributed_optimizer,
            recompute_granularity,
        )
        if not type(model).__name__.endswith("ForCausalLM"):
            raise ValueError(
                f'strategy "megatron" trains causal LMs; {type(model).__name__} (a value model?) '
                "needs torch, deepspeed or fsdp2"
            )
        from roll.distributed.strategies.megatron import model as megatron_model

        self.arch = arch_from_hf(model.config)
        stage_layers = (num_layers_in_first_pipeline_stage, num_layers_in_last_pipeline_stage)
        check_pipeline_stages(pipeline_model_parallel_size, self.arch.num_layers, *stage_layers)
        self.hf_class, self.hf_config = type(model), model.config
        self.generation_config = getattr(model, "generation_config", None)
        self._join_parallel_groups(tensor_model_parallel_size, pipeline_model_parallel_size)
        self._build_gpt(model, recompute_granularity, stage_layers, lora)
        hf_params = sum(p.numel() for p in model.parameters())
        super().__init__(
            megatron_model.MegatronCausalLM(self.gpt, self.arch.vocab_size, self.pipeline), device=device, **kwargs
        )
        state = megatron_model.parallel_state  # TorchTrainStrategy.__init__ starts every engine at one rank
        self.dp_rank, self.dp_size = state.get_data_parallel_rank(), state.get_data_parallel_world_size()
        self.param_counts = self._param_counts(hf_params)

    def _build_gpt(
        self, model: nn.Module, recompute_granularity: str | None, stage_layers: tuple, lora: dict | None
    ) -> None:
        """This rank's part of the Megatron GPT model (its tensor-parallel shard of its pipeline
        stage), loaded with the HF weights of `model`, with LoRA adapters when `lora` is set."""
        from roll.distributed.strategies.megatron import model as megatron_model

        self.gpt = megatron_model.build_gpt_model(
            self.arch,
            next(model.parameters()).dtype,
            tensor_parallel=self.tp_size,
            recompute_granularity=recompute_granularity,
            pipeline_parallel=self.pipeline.size,
            stage_layers=stage_layers,
        )
        self.layer_offset = megatron_model.layer_offset(self.gpt)
        # with tied embeddings over several stages: the first stage's embedding and the last
        # stage's output layer are one weight, whose gradient the two stages sum (_clip_and_step);
        # with LoRA it is frozen
        self.tied_copies = (
            self.pipeline.size > 1
            and self.arch.tied_embeddings
            and lora is None
            and (self.pipeline.first or self.pipeline.last)
        )
        self.embedding_group = megatron_model.parallel_state.get_embedding_group() if self.tied_copies else None
        self._load_hf_weights(model.state_dict())
        self.lora, self.lora_modules = lora, []
        if lora is not None:  # the worker seeded torch: every rank draws the same A
            self.lora_modules = apply_megatron_lora(
                self.gpt,
                **lora,
                tp_group=self.tp_group,
                tp_rank=self.tp_rank,
                tp_size=self.tp_size,
                seed=torch.initial_seed(),
                layer_offset=self.layer_offset,
            )

    def _join_parallel_groups(self, tp: int, pp: int) -> None:
        """Megatron's tensor-, pipeline- and data-parallel groups over the default group; this
        rank's place in them."""
        from roll.distributed.strategies.megatron import model as megatron_model

        megatron_model.init_model_parallel(tp, pp)
        state = megatron_model.parallel_state
        self.tp_group, self.tp_rank, self.tp_size = (
            state.get_tensor_model_parallel_group(),
            state.get_tensor_model_parallel_rank(),
            tp,
        )
        self.pipeline = pipeline_links(state.get_pipeline_model_parallel_group())
        self.data_parallel_group = state.get_data_parallel_group()

    def _load_hf_weights(self, hf_state: dict[str, torch.Tensor]) -> None:
        """Convert the HF weights and load this rank's shard of its stage; a weight the conversion
        does not know stops the build (it would be lost silently)."""
        from roll.distributed.strategies.megatron import model as megatron_model

        self.hf_names = list(hf_state)  # a tied model lists lm_head.weight too; keep HF's names and order
        full = hf_to_megatron(hf_state, self.arch, megatron_model.padded_vocab_size(self.arch, self.tp_size))
        unconverted = sorted(set(self.hf_names) - set(megatron_to_hf(full, self.arch)))
        if unconverted:
            raise ValueError(f'strategy "megatron" cannot convert {unconverted[0]} of {self.hf_class.__name__}')
        megatron_model.load_megatron_state(self.gpt, self._rank_weights(full))

    def _param_counts(self, hf_params: int) -> dict[str, float]:
        """`model/trainable_params` and `model/total_params` of the whole model, as the other
        strategies count them: the HF model's parameters (not megatron's padded, per-rank shards)
        plus the adapters' whole size (summed over the pipeline stages: a collective over them)."""
        adapters = sum(
            p.numel() * (self.tp_size if is_sharded_adapter(name) else 1)
            for name, p in adapter_state(dict(self.gpt.named_parameters())).items()
        )
        if self.pipeline.size > 1:
            total = torch.tensor([adapters], dtype=torch.int64, device=self.device)
            dist.all_reduce(total, group=self.pipeline.group)
            adapters = int(total.item())
        trainable = adapters if self.lora is not None else hf_params
        return {"model/trainable_params": float(trainable), "model/total_params": float(hf_params + adapters)}

    def _rank_weights(self, full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This rank's part of a whole (TP-1, all layers) Megatron state dict: its tensor-parallel
        shard of its pipeline stage."""
        shard = split_tensor_parallel(full, self.arch, self.tp_size)[self.tp_rank]
        if self.pipeline.size == 1:
            return shard
        return stage_state(
            shard, self.arch, self.layer_offset, len(self.gpt.decoder.layers), self.pipeline.first, self.pipeline.last
        )

    # ---- data, tensor and pipeline parallel ---------------------------------------------------
    def _clip_and_step(self, finite: bool) -> tuple[float, bool]:
        finite = self._average_gradients(finite)
        if self.tp_size == 1 and self.pipeline.size == 1:
            return super()._clip_and_step(finite)
        copies = []
        if self.tied_copies:
            tied = self._sum_tied_gradients()
            copies = [tied] if self.pipeline.last else []
        params = [
            (p, is_tensor_parallel(name) or is_sharded_adapter(name))
            for name, p in self.gpt.named_parameters()
            if not any(p is copy for copy in copies)
        ]
        grad_norm = clip_grad_norm_tensor_parallel_(
            params, self.max_grad_norm, self.tp_group, self.pipeline.group, copies
        )
        skipped = not (finite and math.isfinite(grad_norm))
        if not skipped:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm, skipped

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

    def _sum_tied_gradients(self) -> nn.Parameter:
        """Sum the gradients of the tied embedding's two copies (first stage: the embedding, last
        stage: the output layer) over megatron's embedding group, so both hold the gradient of the
        one weight of a single-stage model and take the same optimizer step. Returns this stage's copy."""
        params = dict(self.gpt.named_parameters())
        tied = params[EMBEDDING] if self.pipeline.first else params[OUTPUT]
        grad = tied.grad if tied.grad is not None else torch.zeros_like(tied)
        dist.all_reduce(grad, group=self.embedding_group)
        tied.grad = grad
        return tied

    def _data_parallel_group(self):
        """The data-parallel ranks only: the tensor-parallel ranks of one data-parallel rank hold
        the same rows and metrics, and summing them would count each row tp times."""
        return self.data_parallel_group

    # ---- weights and checkpoints ------------------------------------------------------------
    def _megatron_weights(self) -> dict[str, torch.Tensor]:
        """The whole (TP-1, all layers) Megatron state dict: this rank's parameters (views) with one
        rank; with several, the merged shards of every tensor-parallel rank and the stages' layers
        under their whole-model indices (collectives over the tensor- then pipeline-parallel group)."""
        local = {k: v for k, v in self.gpt.state_dict().items() if torch.is_tensor(v)}
        if self.lora is not None:  # B_local A_local is the rank's shard of B A (megatron.lora)
            local = merged_state(local, self.lora["alpha"] / self.lora["rank"])
        if self.tp_size > 1:
            local = merge_tensor_parallel(gather_shards(local, self.tp_group))
        if self.pipeline.size == 1:
            return local
        return gather_stages(from_stage(local, self.layer_offset, self.arch), self.pipeline, self.device)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """HF-named full CPU copies of the weights, in the HF model's key order. With tensor or
        pipeline parallelism every rank of the model-parallel group must call it (shards and stages
        are gathered); all get them."""
        hf_state = megatron_to_hf(self._megatron_weights(), self.arch)
        return {name: hf_state[name].detach().to("cpu", copy=True).contiguous() for name in self.hf_names}

    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Overwrite the weights from HF-named tensors, this rank's shard of them (optimizer state
        is left as it is). With LoRA they are the frozen base weights; the adapters stay as they are."""
        from roll.distributed.strategies.megatron.model import load_megatron_state, padded_vocab_size

        shard = self._rank_weights(hf_to_megatron(state_dict, self.arch, padded_vocab_size(self.arch, self.tp_size)))
        if self.lora is not None:
            shard = with_base_layer_names(shard, self.lora_modules) | adapter_state(self.gpt.state_dict())
        load_megatron_state(self.gpt, shard)

    def _optimizer_file(self) -> str:
        """optimizer.pt, or optimizer-tp<r>.pt per tensor-parallel rank (moments of its shard), or
        optimizer-tp<r>-pp<s>.pt per tensor-parallel rank and pipeline stage (the TP-only names
        stay as they were without pipeline parallelism, so older checkpoints resume)."""
        if self.pipeline.size > 1:
            return f"optimizer-tp{self.tp_rank}-pp{self.pipeline.stage}.pt"
        return "optimizer.pt" if self.tp_size == 1 else f"optimizer-tp{self.tp_rank}.pt"

    def save_checkpoint(self, directory: str | Path) -> None:
        """HF model dir of the merged weights + scheduler.pt on rank 0, and each (tensor, pipeline)
        rank's optimizer file (`_optimizer_file`, Megatron layout) from data-parallel rank 0.
        Every rank must call it (the shards and stages are gathered).

        The HF model that writes the dir lives on the meta device: it holds no memory, and
        `save_pretrained` writes the tensors it is given (sharding and tied weights as HF does)."""
        directory = Path(directory)
        state = self.state_dict()
        adapter = (self.lora, self._whole_adapter()) if self.lora is not None else None
        if self.dp_rank != 0:  # every data-parallel rank holds the same model and moments
            return
        directory.mkdir(parents=True, exist_ok=True)
        torch.save(self.optimizer.state_dict(), directory / self._optimizer_file())
        if self.rank != 0:
            return
        with torch.device("meta"):
            shell = self.hf_class(self.hf_config)
        if self.generation_config is not None:
            shell.generation_config = self.generation_config
        shell.save_pretrained(directory, state_dict=state)
        torch.save(self.scheduler.state_dict(), directory / "scheduler.pt")
        if adapter is not None:
            self._save_adapter(directory / ADAPTER_DIR, *adapter)

    def _whole_adapter(self) -> dict[str, torch.Tensor]:
        """The adapters of all tensor-parallel ranks and pipeline stages as one adapter of the whole
        model (layers under their whole-model indices; collectives over the ranks)."""
        local = {k: v.detach() for k, v in adapter_state(self.gpt.state_dict()).items()}  # nccl gathers on device
        whole = merge_adapter(gather_shards(local, self.tp_group))
        if self.pipeline.size > 1:
            whole = gather_stages(renumber_layers(whole, self.layer_offset), self.pipeline, self.device)
        return {k: v.cpu() for k, v in whole.items()}

    def _save_adapter(self, directory: Path, lora: dict, adapter: dict[str, torch.Tensor]) -> None:
        """`adapter` as a peft adapter of the HF model (megatron.lora.adapter_to_hf), with `lora`'s
        rank and alpha: what peft's `PeftModel.from_pretrained` loads onto the `pretrain` model,
        and `load_checkpoint` reads."""
        from peft import LoraConfig
        from peft.utils.constants import SAFETENSORS_WEIGHTS_NAME
        from safetensors.torch import save_file

        config = LoraConfig(
            r=lora["rank"],
            lora_alpha=lora["alpha"],
            lora_dropout=0.0,
            bias="none",
            target_modules=hf_target_modules(self.lora_modules),
        )
        config.save_pretrained(str(directory))
        save_file(adapter_to_hf(adapter, self.arch), str(directory / SAFETENSORS_WEIGHTS_NAME))

    def _load_adapter(self, directory: Path) -> None:
        """This rank's shard of the adapter `_save_adapter` wrote, into the model's adapters."""
        from peft.utils import load_peft_weights

        # every layer's modules (a pipeline stage wraps only its own), to read the whole adapter
        kinds = list(dict.fromkeys(name.split(".", 3)[3] for name in self.lora_modules))
        modules = [f"{LAYERS_PREFIX}{i}.{kind}" for i in range(self.arch.num_layers) for kind in kinds]
        whole = adapter_from_hf(load_peft_weights(str(directory), device="cpu"), self.arch, modules)
        stage_layers = range(self.layer_offset, self.layer_offset + len(self.gpt.decoder.layers))
        shard = split_adapter(renumber_layers(whole, -self.layer_offset, stage_layers), self.tp_size)[self.tp_rank]
        params = dict(self.gpt.named_parameters())
        with torch.no_grad():
            for name, value in shard.items():
                params[name].copy_(value)

    def load_checkpoint(self, directory: str | Path) -> None:
        """Restore weights (through the HF class's `from_pretrained`), optimizer and scheduler.
        With LoRA the adapters from `adapter/`; the base stays the `pretrain` weights it was built
        from (the dir's weights are merged: loading them as the base would add the adapters twice)."""
        directory = Path(directory)
        if self.lora is not None:
            self._load_adapter(directory / ADAPTER_DIR)
        else:
            saved = self.hf_class.from_pretrained(directory, dtype=next(self.model.parameters()).dtype)
            self.load_state_dict(saved.state_dict())
            del saved
        self._load_optimizer_state(
            torch.load(directory / self._optimizer_file(), weights_only=True, map_location=self.device)
        )
        restore_schedule(self.scheduler, torch.load(directory / "scheduler.pt", weights_only=True))
