"""`torch` training strategy: one nn.Module on CPU or one GPU, AdamW, an LR schedule, clipping.

The engine behind the actor and critic roles. It knows nothing about PPO: a role hands it a
`loss_fn(model, micro) -> (loss, metrics)` and gets back the optimizer step's metrics. Its
`train_step` (token-weighted accumulation, clipping, the skipped step) is the step every training
engine runs (roll.distributed.ranks makes several ranks equal one process).

Contract: the LR schedule advances once per pipeline step (`step_lr_scheduler()`), not per
optimizer step, so `total_steps` and `warmup_steps` count pipeline steps; dropout is off (PPO
compares forward passes of the same weights); a non-finite loss or gradient norm skips the
optimizer step and reports `<prefix>/skipped_steps` = 1; forwards run once per distinct row
(`<prefix>/unique_row_ratio`, roll.distributed.micro_batches). One process, no gradient averaging:
a role with several ranks needs `deepspeed`, `fsdp2` or `megatron`. LoRA, gradient checkpointing,
dynamic batching and `torch_compile` are switched on by `build_train_strategy`.

Why each choice, and the measurements: docs/engines/torch.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast

import torch
import torch.distributed as dist
from tensordict import TensorDict
from torch import nn
from transformers import get_scheduler

from roll.core.fields import Batch
from roll.distributed.dynamic_batching import TokenBudget
from roll.distributed.micro_batches import (
    MicroForward,
    all_rows,
    batch_rows,
    distinct_micro_batch_rows,
    forward_in_micro_batches,
    iter_distinct_micro_batches,
    token_logprobs,
    trim_padding,
)
from roll.distributed.ranks import micro_weights, without_responses
from roll.distributed.row_images import row_images
from roll.distributed.sequence_packing import PackedSequences, PackingBudget
from roll.distributed.strategies.offload import (
    move_module_,
    move_optimizer_state_,
    release_cached_memory,
)
from roll.models.lora import lora_scaling, merge_lora_state, param_counts, with_saved_adapter

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel

LossFn = Callable[[nn.Module, TensorDict], tuple[torch.Tensor, dict[str, float | torch.Tensor]]]
SchedulerType = Literal["constant", "linear", "cosine"]
# "constant" maps to HF's constant_with_warmup, which is plain constant when warmup_steps == 0.
_HF_SCHEDULER = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}
ADAPTER_DIR = "adapter"
"""Subdirectory of a LoRA checkpoint with the peft adapter (the dir itself is the merged model)."""


class TorchTrainStrategy:
    """AdamW + LR schedule + grad clipping + gradient accumulation around one model.

    `dedupe_rows=False` runs the model on every row, copies included, with the same results; it
    exists to measure what deduplication saves (benchmarks/train_dedupe.py).
    """

    takes_old_logprobs = True
    """Whether a training step may take PPO's old log-probs from its own forward
    (`roll.distributed.workers.old_logprobs`)."""

    FUSED_ADAMW = True
    """On CUDA, torch's fused AdamW kernel (one launch for all parameters) instead of the per-list
    `foreach` one; the same update to float rounding. False where another library owns the step's
    parameters (DeepSpeed's flat ZeRO partitions) or where it was not faster (FSDP2's DTensors,
    docs/benchmarks.md, GPU lane)."""

    def __init__(
        self,
        model: nn.Module,
        *,
        learning_rate: float,
        weight_decay: float,
        adam_betas: tuple[float, float],
        adam_epsilon: float,
        lr_scheduler_type: SchedulerType,
        warmup_steps: int,
        total_steps: int,
        max_grad_norm: float,
        micro_batch_size: int,
        metric_prefix: str,
        device: str | torch.device = "cpu",
        dedupe_rows: bool = True,
        train_budget: TokenBudget | None = None,
        infer_budget: TokenBudget | None = None,
        torch_compile: bool = False,
        sequence_packing: bool = False,
    ) -> None:
        self.device = torch.device(device)
        self.dedupe_rows = dedupe_rows
        # the HF class checkpoints load with (FSDP2 sets it before fully_shard swaps in a subclass)
        self.model_class = getattr(self, "model_class", type(model))
        self.model = model.to(self.device)
        self.train_module: nn.Module = self.model  # what loss_fn calls: an engine may wrap the model
        self.model.train()
        _disable_dropout(self.model)
        if torch_compile:  # in place: the module, its parameters and state_dict keys stay the same
            self.model.compile()
        self.max_grad_norm = max_grad_norm
        self.micro_batch_size = micro_batch_size
        self.train_budget, self.infer_budget = train_budget, infer_budget  # dynamic batching, None: off
        self.sequence_packing = sequence_packing
        self.balance_ranks = isinstance(train_budget, PackingBudget)  # ROLL's batch_balance (ranks.rank_share)
        self.lora_scaling = lora_scaling(self.model)  # None unless roll.models.lora.apply_lora wrapped it
        self.param_counts = param_counts(self.model)  # before an engine partitions the parameters
        self.metric_prefix = metric_prefix
        self.consecutive_skips = 0  # optimizer steps in a row skipped for a non-finite loss/grad
        # Data-parallel rank and ranks; engines that average gradients over ranks set them.
        self.dp_rank, self.dp_size = 0, 1
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],  # LoRA: the adapters only
            lr=learning_rate,
            betas=adam_betas,
            eps=adam_epsilon,
            weight_decay=weight_decay,
            fused=fused_adamw(self.device, self.FUSED_ADAMW),
        )
        self.scheduler = get_scheduler(
            _HF_SCHEDULER[lr_scheduler_type],
            self.optimizer,
            num_warmup_steps=warmup_steps,
            num_training_steps=total_steps,
        )

    # ---- forward -----------------------------------------------------------------------------
    def forward(
        self, batch: TensorDict, forward: MicroForward, micro_batch_size: int | None = None
    ) -> dict[str, torch.Tensor]:
        """`forward(model, micro)` over micro-batches under no_grad; (B, T) outputs on CPU."""
        micro_batch_size = micro_batch_size or self.micro_batch_size
        # sharded engines (ZeRO-3, FSDP2) gather weights in every forward, a collective each: a
        # rank with fewer micro-batches than another adds stand-ins (agreed before any forward)
        stand_ins = self._forward_stand_ins(batch, micro_batch_size) if self.dp_size > 1 else 0
        out = forward_in_micro_batches(
            self._packed(self.model),
            batch,
            forward,
            micro_batch_size,
            self.device,
            dedupe=self.dedupe_rows,
            budget=self.infer_budget,
        )
        if stand_ins:
            stand_in = trim_padding(batch[:1]).to(self.device)
            with torch.no_grad():
                for _ in range(stand_ins):
                    forward(self._packed(self.model), stand_in)
        return out

    def _forward_stand_ins(self, batch: TensorDict, micro_batch_size: int) -> int:
        """How many micro-batches fewer this rank's forward has than the rank with the most."""
        rows = batch_rows(batch, self.dedupe_rows)
        made = len(list(distinct_micro_batch_rows(rows, micro_batch_size, batch["attention_mask"], self.infer_budget)))
        return self._max_over_ranks(made) - made

    def forward_logprobs(
        self,
        batch: TensorDict,
        temperature: float,
        with_entropy: bool = False,
        micro_batch_size: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (B, T) and entropy (B, T) or None, aligned as in `token_logprobs`, of the
        tokens under `batch`'s response mask where it has one, else of every real token."""

        def logprobs_forward(model: nn.Module, micro: TensorDict) -> dict[str, torch.Tensor]:
            ids, mask = micro["input_ids"], micro["attention_mask"]
            logprobs, entropy = token_logprobs(
                model,
                ids,
                mask,
                temperature,
                with_entropy,
                self.dedupe_rows,
                images=row_images(micro),
                scored=micro.get(Batch.RESPONSE_MASK, None),
            )
            return {"logprobs": logprobs} | ({"entropy": entropy} if entropy is not None else {})

        out = self.forward(batch, logprobs_forward, micro_batch_size)
        return out["logprobs"], out.get("entropy")

    # ---- training ----------------------------------------------------------------------------
    def train_step(
        self,
        minibatch: TensorDict,
        loss_fn: LossFn,
        weight_by: Literal["tokens", "rows"] = "tokens",
        total_weight: float | None = None,
    ) -> dict[str, float]:
        """One optimizer step on `minibatch`, accumulating gradients over micro-batches.

        `loss_fn` returns the mean loss of its micro-batch. Each micro-batch's loss is scaled by
        its share of the minibatch: its share of `response_mask` tokens for token-mean losses
        (`weight_by="tokens"`), its share of rows with a response token for sequence-mean losses
        (`weight_by="rows"`). The accumulated gradient then equals the gradient of the loss over
        the whole minibatch, however it is split. `loss_fn`'s metrics are averaged with the same
        weights, so they too are minibatch values.

        Data parallel: `minibatch` is this rank's share and `total_weight` the whole mini-batch's
        count over all ranks (`roll.distributed.ranks`); shares are then weighted against it,
        scaled by the ranks the engine averages over, ranks run equally many backward passes
        (stand-ins weigh 0), skip together, and the loss metrics are summed over ranks: every rank
        returns the whole mini-batch's metrics. `total_weight` None: the rank's own count.

        With `dedupe_rows`, a micro-batch holds at most `micro_batch_size` distinct rows and every
        row of the minibatch sharing them (`iter_distinct_micro_batches`; rows differing only in
        their last token share one), so `loss_fn` must run its model once per distinct row, as
        `token_logprobs` and `shifted_values` do. With dynamic batching (`train_budget`) the
        micro-batches are token-budget bins instead (roll.distributed.dynamic_batching); the
        weights above make the step the same.
        """
        distinct = batch_rows(minibatch, dedupe=True)  # rows with images share only with equal images
        grouping = distinct if self.dedupe_rows else all_rows(len(minibatch))
        micros = list(iter_distinct_micro_batches(minibatch, self.micro_batch_size, grouping, self.train_budget))
        across_ranks = total_weight is not None and self.dp_size > 1
        scale = self.dp_size if across_ranks else 1  # the engine averages the ranks' gradients
        weights = micro_weights(micros, weight_by, total_weight, world_size=scale)
        if self.dp_size > 1:
            micros, weights = self._as_many_micros_as_every_rank(micros, weights)
        metrics, finite = self._accumulate(micros, weights, loss_fn, scale)
        if self.dp_size > 1:
            finite = bool(self._reduce_over_ranks([float(finite)], dist.ReduceOp.MIN)[0])
        grad_norm, skipped = self._clip_and_step(finite)
        self.consecutive_skips = self.consecutive_skips + 1 if skipped else 0
        prefix = self.metric_prefix
        unique_ratio = distinct.ratio
        if across_ranks:  # each rank holds its terms of the mini-batch means: add them up
            *sums, unique_ratio = self._reduce_over_ranks(
                [*metrics.values(), distinct.ratio / self.dp_size], dist.ReduceOp.SUM
            )
            metrics = dict(zip(metrics, sums, strict=True))
        return metrics | {
            f"{prefix}/grad_norm": grad_norm,
            f"{prefix}/lr": self.current_lr(),
            f"{prefix}/skipped_steps": float(skipped),
            f"{prefix}/consecutive_skipped_steps": float(self.consecutive_skips),
            f"{prefix}/unique_row_ratio": unique_ratio,
        }

    def _accumulate(
        self, micros: list[TensorDict], weights: list[float], loss_fn: LossFn, scale: int
    ) -> tuple[dict[str, float], bool]:
        """Backward of each micro-batch's loss times its weight; the metrics weighted alike (over
        `scale` ranks), and whether every loss so far was finite (after one is not, this rank
        runs no more backward passes unless other ranks wait on its collectives)."""
        metrics: dict[str, float] = {}
        finite = True
        for i, (micro, weight) in enumerate(zip(micros, weights, strict=True)):
            loss, micro_metrics = loss_fn(self._packed(self.train_module), micro.to(self.device))
            finite = finite and bool(torch.isfinite(loss))
            if finite or self.dp_size > 1:  # ranks keep their collectives matched and skip together
                self._backward(loss * weight, last=i == len(micros) - 1)
            for key, value in micro_metrics.items():
                metrics[key] = metrics.get(key, 0.0) + weight / scale * float(value)
        return metrics, finite

    def _packed(self, module):
        """`module` as the losses and forwards call it: on packed rows with `sequence_packing`."""
        return PackedSequences(module) if self.sequence_packing else module

    def _as_many_micros_as_every_rank(self, micros: list[TensorDict], weights: list[float]):
        """Pad with stand-ins (no response token, weight 0) to the most micro-batches any rank has:
        sharded engines run collectives in every forward and backward, so the counts must match."""
        stand_ins = self._max_over_ranks(len(micros)) - len(micros)
        return micros + [without_responses(micros[0])] * stand_ins, weights + [0.0] * stand_ins

    def sum_over_ranks(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` summed over the data-parallel ranks, on this rank's device; every rank must call it."""
        return self._all_reduce(tensor, dist.ReduceOp.SUM)

    def _data_parallel_group(self):
        """The process group of the data-parallel ranks: the default one (every process is a rank)."""
        return None

    def _max_over_ranks(self, value: int) -> int:
        return int(self._reduce_over_ranks([float(value)], dist.ReduceOp.MAX)[0])

    def _reduce_over_ranks(self, values: list[float], op) -> list[float]:
        """`values` reduced element-wise over the data-parallel ranks (`_data_parallel_group`)."""
        return self._all_reduce(torch.tensor(values, dtype=torch.float64), op).cpu().tolist()

    def _all_reduce(self, tensor: torch.Tensor, op) -> torch.Tensor:
        """`tensor` on this rank's device (nccl reduces device tensors only), reduced there by `op`
        over the data-parallel ranks."""
        tensor = tensor.to(self.device)
        dist.all_reduce(tensor, op=op, group=self._data_parallel_group())
        return tensor

    # The two places an engine differs in a training step (DeepSpeed and FSDP2 override them).
    def _backward(self, loss: torch.Tensor, last: bool) -> None:
        """Accumulate `loss`'s gradient; `last`: the mini-batch's last micro-batch."""
        loss.backward()

    def _clip_and_step(self, finite: bool) -> tuple[float, bool]:
        """Clip, then step unless the loss or the gradient norm is non-finite; (norm, skipped)."""
        grad_norm = _as_float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm))
        skipped = not (finite and math.isfinite(grad_norm))
        if not skipped:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm, skipped

    def current_lr(self) -> float:
        """Learning rate the next optimizer step will use."""
        return float(self.optimizer.param_groups[0]["lr"])

    def step_lr_scheduler(self) -> None:
        """Advance the LR schedule by one pipeline step (see module docstring)."""
        self.scheduler.step()

    # ---- colocation: leave the device to another role, then come back ----------------------
    def offload(self, to: str | torch.device = "cpu") -> None:
        """Move weights, gradients and optimizer state to `to` (CPU by default) and free their
        device memory for a colocated role; `reload` brings them back. Nothing is rebuilt: the
        optimizer, its moments and step counts, and the LR schedule are the same objects after
        the round trip. While offloaded call nothing but `reload` (under DeepSpeed ZeRO the
        module's parameters are empty then), so take weights for the engines before."""
        self._move_training_state(to)
        release_cached_memory(self.device)

    def reload(self) -> None:
        """Bring what `offload` moved back to `self.device`."""
        self._move_training_state(self.device)

    def _move_training_state(self, device: str | torch.device) -> None:
        move_module_(self.model, device)
        move_optimizer_state_(self.optimizer, device)

    # ---- weights and checkpoints ------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        """A snapshot of the model weights under HF names: what inference workers load. With LoRA
        the merged weights (`roll.models.lora.merge_lora_state`): engines see a plain HF model."""
        return self._as_hf(self._full_state())

    def _full_state(self) -> dict[str, torch.Tensor]:
        """The module's own state dict (peft names with LoRA) as detached CPU copies; engines that
        shard the model gather it here. Copies, not views: on CPU a view would keep changing."""
        return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in self.model.state_dict().items()}

    def _as_hf(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return state if self.lora_scaling is None else merge_lora_state(state, self.lora_scaling)

    def _save_model_dir(self, directory: Path, state: dict[str, torch.Tensor]) -> None:
        """Write `state` (`_full_state`) as an HF model dir; with LoRA the merged model, and the
        adapter beside it in `directory/adapter` (peft's format; what `load_checkpoint` restores)."""
        if self.lora_scaling is None:  # an HF model, as the role loaded it
            cast("PreTrainedModel", self.model).save_pretrained(directory, state_dict=state)
            return
        peft_model = cast("PeftModel", self.model)  # lora_scaling is set: apply_lora's peft wrapper
        base = cast("PreTrainedModel", peft_model.get_base_model())  # peft types it as nn.Module
        base.save_pretrained(directory, state_dict=merge_lora_state(state, self.lora_scaling))
        peft_model.save_pretrained(str(directory / ADAPTER_DIR), state_dict=state)

    def _saved_model_state(self, directory: Path) -> dict[str, torch.Tensor]:
        """The module state to restore from a checkpoint dir: the HF weights through
        `from_pretrained` of the model's own class (sharded files, tied embeddings and HF key
        conversions handled as HF saved them); with LoRA the base as it is and the saved adapter."""
        if self.lora_scaling is not None:
            from peft.utils import load_peft_weights

            return with_saved_adapter(self._full_state(), load_peft_weights(str(directory / ADAPTER_DIR), device="cpu"))
        model_class = cast("type[PreTrainedModel]", self.model_class)  # without LoRA: the HF model's class
        saved = model_class.from_pretrained(directory, dtype=next(self.model.parameters()).dtype)
        return saved.state_dict()

    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Overwrite the model weights (optimizer state is left as it is); keys as in the module's
        own state dict (with LoRA: peft's names, adapters included, as `_full_state` gives)."""
        self.model.load_state_dict(state_dict)

    def save_checkpoint(self, directory: str | Path) -> None:
        """HF model dir (safetensors via save_pretrained) + optimizer.pt + scheduler.pt."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._save_model_dir(directory, self._full_state())
        torch.save(self.optimizer.state_dict(), directory / "optimizer.pt")
        torch.save(self.scheduler.state_dict(), directory / "scheduler.pt")

    def load_checkpoint(self, directory: str | Path) -> None:
        """Restore model weights, optimizer and scheduler written by `save_checkpoint`.

        Weights as in `_saved_model_state`.
        """
        directory = Path(directory)
        self.load_state_dict(self._saved_model_state(directory))
        self._load_optimizer_state(torch.load(directory / "optimizer.pt", weights_only=True, map_location=self.device))
        restore_schedule(self.scheduler, torch.load(directory / "scheduler.pt", weights_only=True))

    def _load_optimizer_state(self, state: dict) -> None:
        """Adam's moments and steps from a checkpoint, under this engine's kernel choice (the
        optimizer's `defaults`): torch's `load_state_dict` also takes the saved groups' `fused` /
        `foreach`, so a checkpoint written on CPU (or before fused AdamW) would resume unfused."""
        self.optimizer.load_state_dict(state)
        for group in self.optimizer.param_groups:
            group["fused"], group["foreach"] = self.optimizer.defaults["fused"], self.optimizer.defaults["foreach"]
        move_optimizer_state_(self.optimizer, self.device)  # fused: the step counters live on the device


def restore_schedule(scheduler, state: dict) -> None:
    """Resume the LR schedule at the saved step, under this run's config.

    The rule: the learning rate of pipeline step t is the schedule this run's config describes
    (`learning_rate`, `lr_scheduler_type`, `warmup_steps` and `max_steps`) evaluated at t; only
    the step count comes from the checkpoint. So resuming a finished 2-step cosine run with
    max_steps=5 trains step 3 at the 5-step cosine's value for step 3, not at the 0.0 where the
    2-step schedule ended (the optimizer's saved learning rate), followed by a jump. With an
    unchanged config this is exactly the learning rate the uninterrupted run would use."""
    scheduler.last_epoch = int(state["last_epoch"])
    lrs = [base * fn(scheduler.last_epoch) for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    for group, base, lr in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, lrs):
        group["initial_lr"], group["lr"] = base, lr
    scheduler._last_lr = lrs


def fused_adamw(device: torch.device, allowed: bool) -> bool | None:
    """AdamW's `fused` argument: True on CUDA where the engine allows it, else None (torch's default:
    `foreach` on CUDA, the for-loop on CPU; CPU has a fused kernel too, not measured faster here)."""
    return True if allowed and device.type == "cuda" else None


def _as_float(norm: torch.Tensor) -> float:
    """A gradient norm as a float; FSDP2 returns a DTensor, whose value is its full tensor."""
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def _disable_dropout(model: nn.Module) -> None:
    """Set p = 0 on every dropout layer (see module docstring)."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
