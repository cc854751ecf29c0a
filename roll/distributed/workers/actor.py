"""Actor role: the policy being trained with a policy-gradient loss (+ entropy bonus).

The loss is `roll.algorithms.actor_loss.actor_loss`: `pg_variant`'s (`roll.algorithms.pg_variants`;
the default is PPO-clip, Schulman et al. 2017, with optional asymmetric clipping, DAPO's
clip-higher) over per-token ratios, the entropy bonus aggregated with the same `loss_agg_mode`,
with `use_kl_loss` kl_loss_coef * KL(pi || reference), and optional off-policy weights of the
trainer's old log-probs over the engine's. `train` takes its `PolicyLossOptions` whole, built once
per run, and hands them to the loss unchanged. No value loss here: the critic is its own role.
"""

from __future__ import annotations

import shutil
from functools import partial
from pathlib import Path

import torch
from tensordict import TensorDict
from torch import nn
from transformers import PreTrainedTokenizerBase

from roll.algorithms.actor_loss import PolicyLossOptions, actor_loss
from roll.configs.worker import TrainingArgs
from roll.core.fields import Batch
from roll.distributed.micro_batches import token_logprobs
from roll.distributed.ranks import WeightBy
from roll.distributed.row_images import row_images
from roll.distributed.strategies.registry import build_train_strategy
from roll.distributed.weight_transfer import IpcWeights, share_state
from roll.distributed.workers.common import (
    average_metrics,
    minibatch_rows,
    model_inputs,
    scoring_inputs,
    set_num_threads,
    take_memory_gib,
    train_on_share,
)
from roll.distributed.workers.old_logprobs import OldLogprobs, logprob_abs_diff
from roll.distributed.workers.work_clock import Clocked, timed
from roll.models.loading import DType, load_policy, load_tokenizer

TRAIN_KEYS = (Batch.INPUT_IDS, Batch.ATTENTION_MASK, Batch.RESPONSE_MASK, Batch.ADVANTAGES)
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")


class ActorWorker(Clocked):
    """Holds the trainable policy: old log-probs, PPO updates, weights for inference, checkpoints.

    `total_train_steps` and `training_args.warmup_steps` count pipeline training steps (one
    `train()` call each), the unit the LR schedule advances in. Forward passes run the model once
    per distinct row (roll.distributed.micro_batches); `dedupe_rows=False` runs every copy, with the same
    results, to measure what that saves (benchmarks/training/train_dedupe.py). `features` are the strategy
    features of `build_train_strategy` (lora, gradient_checkpointing, train_budget, infer_budget).
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
        dedupe_rows: bool = True,
        strategy_name: str = "torch",
        strategy_config: dict | None = None,
        features: dict | None = None,
    ) -> None:
        set_num_threads(num_threads, device)
        torch.manual_seed(seed)
        self.seed = seed
        self.mini_batch_rows = training_args.mini_batch_size
        model = load_policy(model_path, dtype=dtype, attn_implementation=attn_implementation, device=device)
        self.strategy = build_train_strategy(
            model,
            training_args,
            total_steps=total_train_steps,
            metric_prefix="actor",
            device=device,
            dedupe_rows=dedupe_rows,
            strategy_name=strategy_name,
            strategy_config=strategy_config,
            **(features or {}),
        )
        self.tokenizer = _load_tokenizer(model_path)
        self.model_path = model_path

    @timed("compute")
    def compute_logprobs(self, batch: TensorDict, temperature: float) -> torch.Tensor:
        """Log-probs (B, T) of the current weights (the PPO "old" log-probs), CPU float32: of the
        response tokens where `batch` has a response mask, else of every real token."""
        logprobs, _ = self.strategy.forward_logprobs(scoring_inputs(batch), temperature)
        return logprobs

    @timed("compute")
    def train(self, batch: TensorDict, loss: PolicyLossOptions, *, ppo_epochs: int, step: int) -> dict[str, float]:
        """`ppo_epochs` shuffled passes of mini-batches over `batch`; metrics averaged over steps.

        `batch` needs input_ids, attention_mask, response_mask, advantages (B, T) and the fields of
        `loss.batch_fields` (`roll.algorithms.actor_loss`): old_logprobs, or else infer_logprobs
        (the old log-probs are then taken in this call, `roll.distributed.workers.old_logprobs`,
        and `rollout/logprob_abs_diff` is among the metrics). Mini-batches hold
        per_device_train_batch_size * gradient_accumulation_steps * ranks rows, in an order drawn
        from derive_seed(seed, "minibatch", step, epoch); with several data-parallel ranks every
        rank gets the whole `batch` and trains on its share of each mini-batch.
        "actor/unique_row_ratio" is the mean over mini-batches of their distinct rows / rows.
        """
        take_old = Batch.OLD_LOGPROBS not in batch.keys()  # then taken here (workers.old_logprobs)
        if take_old and not self.strategy.takes_old_logprobs:
            raise ValueError(f"{type(self.strategy).__name__} needs the batch's old_logprobs (compute_logprobs)")
        extra = loss.batch_fields(take_old, has_versions=Batch.POLICY_VERSION in batch.keys())
        batch = model_inputs(batch, *TRAIN_KEYS, *extra)
        loss_fn = partial(_policy_loss, options=loss, dedupe=self.strategy.dedupe_rows)
        weight_by: WeightBy = "tokens" if loss.agg_mode == "token-mean" else "rows"
        per_step, old_metrics = self._optimizer_steps(batch, loss_fn, weight_by, loss.temperature, ppo_epochs, step)
        self.strategy.step_lr_scheduler()
        summed, last = ("actor/skipped_steps",), ("actor/consecutive_skipped_steps",)
        return average_metrics(per_step, summed=summed, last=last) | old_metrics

    def _optimizer_steps(
        self, batch: TensorDict, loss_fn, weight_by: WeightBy, temperature: float, ppo_epochs: int, step: int
    ) -> tuple[list[dict[str, float]], dict[str, float]]:
        """One optimizer step per mini-batch of each epoch: their metrics, and where `batch` came
        without old log-probs, `rollout/logprob_abs_diff` of those taken at the first step."""
        rows = self.mini_batch_rows * self.strategy.dp_size  # over all data-parallel ranks, as in ROLL
        per_step, old_metrics = [], {}
        for epoch in range(ppo_epochs):
            for minibatch in minibatch_rows(batch.batch_size[0], rows, self.seed, "minibatch", step, epoch):
                if Batch.OLD_LOGPROBS in batch.keys():
                    per_step.append(train_on_share(self.strategy, batch[minibatch], loss_fn, weight_by))
                    continue
                # the first step: the weights are still those before the update, so its log-probs are the old ones
                old = OldLogprobs(batch, minibatch, self.strategy, temperature)
                old.score_others()
                first = train_on_share(self.strategy, old.first_minibatch(), partial(loss_fn, old=old), weight_by)
                per_step.append(first)
                batch[Batch.OLD_LOGPROBS] = old.tensor()
                old_metrics = logprob_abs_diff(batch)
        return per_step, old_metrics

    @timed("sync")
    def get_weights(self) -> dict[str, torch.Tensor]:
        """Policy weights, detached, contiguous, on CPU, for `model_update` of inference workers."""
        return self.strategy.state_dict()

    @timed("sync")
    def share_weights(self) -> IpcWeights:
        """CUDA IPC handles of the policy's own device tensors, no copy, for an engine on the same
        GPU (`roll.distributed.weight_transfer`; one `torch` rank without LoRA: the module holds the
        HF weights). Valid while the module stays on the device and unchanged."""
        return share_state(self.strategy.model.state_dict())

    def memory_gib(self) -> dict[str, float]:
        """This process's GPU memory since the last call (`take_memory_gib`); zeros on CPU."""
        return take_memory_gib()

    def param_counts(self) -> dict[str, float]:
        """`model/trainable_params` and `model/total_params` of the trained model (LoRA: adapters)."""
        return dict(self.strategy.param_counts)

    def save_checkpoint(self, directory: str) -> None:
        """An HF model dir (plus tokenizer when the base model had one) + optimizer/scheduler."""
        self.strategy.save_checkpoint(directory)  # collective with several ranks; rank 0 writes
        first_rank = self.strategy.dp_rank == 0 and getattr(self.strategy, "tp_rank", 0) == 0  # megatron TP
        if self.tokenizer is not None and first_rank:
            self.tokenizer.save_pretrained(directory)
        if first_rank:  # a VL model's processor files, so the checkpoint loads with its processor
            for name in PROCESSOR_FILES:
                if (Path(self.model_path) / name).is_file():
                    shutil.copy(Path(self.model_path) / name, Path(directory) / name)

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


def _policy_loss(
    model: nn.Module, micro: TensorDict, *, options: PolicyLossOptions, dedupe: bool, old: OldLogprobs | None = None
) -> tuple[torch.Tensor, dict[str, float]]:
    """`actor_loss` on one micro-batch, after this forward's log-probs and entropy. The old
    log-probs are the micro-batch's, or with `old` (the first optimizer step of a call that takes
    them itself) this forward's own, detached."""
    logprobs, entropy = token_logprobs(
        model,
        micro["input_ids"],
        micro["attention_mask"],
        options.temperature,
        with_entropy=True,
        dedupe=dedupe,
        images=row_images(micro),
        scored=micro[Batch.RESPONSE_MASK],
    )
    assert entropy is not None  # asked for
    old_logprobs = micro[Batch.OLD_LOGPROBS] if old is None else old.take(micro, logprobs)
    return actor_loss(logprobs, entropy, old_logprobs, micro, options)


PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")
"""A multimodal model's processor files besides its tokenizer's (copied into each checkpoint)."""


def _load_tokenizer(model_path: str) -> PreTrainedTokenizerBase | None:
    """The base model's tokenizer, so checkpoints are complete HF dirs; None if it has none."""
    if not any((Path(model_path) / name).exists() for name in TOKENIZER_FILES):
        return None
    return load_tokenizer(model_path)
