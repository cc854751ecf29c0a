"""Critic role: a value model trained by clipped value regression onto the returns.

Convention (shared with GAE in roll.algorithms): values[:, t] = V(input_ids[:, :t]), the value of
the state in which token t was generated, i.e. the value head's output at position t - 1. It
lines up with logprobs[:, t]; values[:, 0] and padding positions are 0.
"""

from __future__ import annotations

from functools import partial
from typing import Literal

import torch
from tensordict import TensorDict
from torch import nn

from roll.algorithms.losses import AggMode, value_loss
from roll.configs.worker import TrainingArgs
from roll.core.fields import Batch
from roll.core.seeding import derive_seed
from roll.distributed.micro_batches import shifted_values
from roll.distributed.strategies.registry import build_train_strategy
from roll.distributed.workers.common import (
    average_metrics,
    set_num_threads,
    shuffled_minibatches,
    take_memory_gib,
    train_on_share,
)
from roll.distributed.workers.work_clock import Clocked, timed
from roll.models.loading import DType, load_value_model

TRAIN_KEYS = (Batch.INPUT_IDS, Batch.ATTENTION_MASK, Batch.RESPONSE_MASK, Batch.VALUES, Batch.RETURNS)


class CriticWorker(Clocked):
    """Holds the value model: values for GAE, value updates, checkpoints.

    `total_train_steps` and `training_args.warmup_steps` count pipeline training steps.
    """

    def __init__(
        self,
        model_path: str,
        training_args: TrainingArgs,
        *,
        total_train_steps: int,
        seed: int,
        num_threads: int | None = None,
        dtype: DType = "float32",
        attn_implementation: str | None = None,
        device: str = "cpu",
        strategy_name: str = "torch",
        strategy_config: dict | None = None,
        features: dict | None = None,
    ) -> None:
        set_num_threads(num_threads, device)
        torch.manual_seed(seed)
        self.seed = seed
        self.mini_batch_rows = training_args.mini_batch_size
        model = load_value_model(
            model_path,
            dtype=dtype,
            seed=derive_seed(seed, "value_head"),
            attn_implementation=attn_implementation,
            device=device,
        )
        self.strategy = build_train_strategy(
            model,
            training_args,
            total_steps=total_train_steps,
            metric_prefix="critic",
            device=device,
            strategy_name=strategy_name,
            strategy_config=strategy_config,
            **(features or {}),
        )

    @timed("compute")
    def compute_values(self, batch: TensorDict) -> torch.Tensor:
        """Values (B, T) under the convention in the module docstring, CPU float32."""
        out = self.strategy.forward(batch.select("input_ids", "attention_mask"), _values_forward)
        return out["values"]

    @timed("compute")
    def train(
        self,
        batch: TensorDict,
        *,
        ppo_epochs: int,
        value_clip: float | None,
        loss_agg_mode: AggMode,
        step: int,
    ) -> dict[str, float]:
        """`ppo_epochs` shuffled passes of clipped value regression; metrics averaged over steps.

        `batch` needs input_ids, attention_mask, response_mask, values (the old values from
        `compute_values`) and returns (B, T). Order from derive_seed(seed, "critic_minibatch",
        step, epoch); mini-batches and rank shares as in `ActorWorker.train`. "critic/unique_row_ratio" is the
        mean over mini-batches of their distinct
        rows / rows (the value model runs once per distinct row, roll.distributed.micro_batches).
        """
        batch = batch.select(*TRAIN_KEYS)
        loss_fn = partial(_value_loss, value_clip=value_clip, loss_agg_mode=loss_agg_mode)
        weight_by: Literal["tokens", "rows"] = "tokens" if loss_agg_mode == "token-mean" else "rows"
        rows = self.mini_batch_rows * self.strategy.dp_size  # over all data-parallel ranks, as in ROLL
        per_step = [
            train_on_share(self.strategy, minibatch, loss_fn, weight_by)
            for epoch in range(ppo_epochs)
            for minibatch in shuffled_minibatches(batch, rows, self.seed, "critic_minibatch", step, epoch)
        ]
        self.strategy.step_lr_scheduler()
        return average_metrics(per_step, summed=("critic/skipped_steps",), last=("critic/consecutive_skipped_steps",))

    def memory_gib(self) -> dict[str, float]:
        """This process's GPU memory since the last call (`take_memory_gib`); zeros on CPU."""
        return take_memory_gib()

    def param_counts(self) -> dict[str, float]:
        """`model/trainable_params` and `model/total_params` of the trained model (LoRA: adapters)."""
        return dict(self.strategy.param_counts)

    def save_checkpoint(self, directory: str) -> None:
        """An HF value-model dir + optimizer/scheduler state."""
        self.strategy.save_checkpoint(directory)

    def load_checkpoint(self, directory: str) -> None:
        """Restore weights, optimizer and LR schedule from `save_checkpoint`'s directory."""
        self.strategy.load_checkpoint(directory)

    @timed("sync")
    def offload(self) -> None:
        """Weights, gradients and optimizer state to CPU while a colocated role uses the device."""
        self.strategy.offload()

    @timed("sync")
    def reload(self) -> None:
        """Back onto the device, exactly as they were (`TorchTrainStrategy.offload`)."""
        self.strategy.reload()


def _values_forward(model: nn.Module, micro: TensorDict) -> dict[str, torch.Tensor]:
    return {"values": shifted_values(model, micro["input_ids"], micro["attention_mask"])}


def _value_loss(
    model: nn.Module, micro: TensorDict, *, value_clip: float | None, loss_agg_mode: AggMode
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss on one micro-batch; metrics as floats."""
    values = shifted_values(model, micro["input_ids"], micro["attention_mask"])
    loss, metrics = value_loss(
        values, micro[Batch.VALUES], micro[Batch.RETURNS], micro[Batch.RESPONSE_MASK], value_clip, loss_agg_mode
    )
    return loss, {key: float(value) for key, value in metrics.items()}
