"""Actor role: the policy being trained with a policy-gradient loss (+ entropy bonus).

The loss is `pg_variant`'s (`roll.algorithms.pg_variants`); the default is PPO-clip (Schulman et
al. 2017) with optional asymmetric clipping (`pg_clip_high`, DAPO's clip-higher) over per-token
ratios; the entropy bonus is aggregated with the same `loss_agg_mode` as the policy loss. With
`use_kl_loss`, kl_loss_coef * KL(pi || reference) is added (`roll.algorithms.kl.kl_loss`).
Optional off-policy correction: truncated importance weights of the trainer's old log-probs over
the engine's (`roll.algorithms.off_policy`) scale each token's policy-gradient term. No value
loss here: the critic is its own role.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch
from tensordict import TensorDict
from torch import nn
from transformers import PreTrainedTokenizerBase

from roll.algorithms.kl import KLKind, kl_loss
from roll.algorithms.losses import AggMode, agg_loss
from roll.algorithms.off_policy import (
    TISLevel,
    tis_metrics,
    truncated_importance_weights,
)
from roll.algorithms.pg_variants import PGOptions, policy_gradient_loss
from roll.algorithms.train_infer import train_infer_correction
from roll.algorithms.utils import masked_mean
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
    results, to measure what that saves (benchmarks/train_dedupe.py). `features` are the strategy
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
    def train(
        self,
        batch: TensorDict,
        *,
        temperature: float,
        ppo_epochs: int,
        pg_clip: float,
        pg_clip_high: float | None = None,
        entropy_loss_coef: float,
        loss_agg_mode: AggMode,
        step: int,
        tis_level: TISLevel | None = None,
        tis_cap: float | None = None,
        pg_variant: str = "ppo",
        pg_options: PGOptions | None = None,
        kl_loss_coef: float | None = None,
        kl_loss_type: KLKind = "low_var_kl",
        correction: dict | None = None,
    ) -> dict[str, float]:
        """`ppo_epochs` shuffled passes of mini-batches over `batch`; metrics averaged over steps.

        `batch` needs input_ids, attention_mask, response_mask, advantages (B, T), old_logprobs
        or else infer_logprobs (the old log-probs are then taken in this call,
        `roll.distributed.workers.old_logprobs`, and `rollout/logprob_abs_diff` is among the
        metrics), and infer_logprobs when `tis_level` ("token" / "sequence") turns the off-policy
        correction on (weights truncated at `tis_cap`), and episode_scores (B,) for pg_variant
        "topr". `pg_options` holds the variant's parameters; its clip range is `pg_clip` /
        `pg_clip_high` (None: PGOptions' defaults for the rest). With `kl_loss_coef` set (the KL
        loss is on) the batch needs ref_logprobs, and kl_loss_coef * KL(`kl_loss_type`) is added.
        `correction` (`TrainInferCorrection.loss_options()`) weights and filters each token by the
        trainer/engine log-prob gap (`roll.algorithms.train_infer`); it needs infer_logprobs.
        Mini-batches hold per_device_train_batch_size * gradient_accumulation_steps * ranks rows, in
        an order drawn from derive_seed(seed, "minibatch", step, epoch); with several data-parallel
        ranks every rank gets the whole `batch` and trains on its share of each mini-batch. "actor/unique_row_ratio" is
        the mean over mini-batches of their distinct rows / rows.
        """
        take_old = Batch.OLD_LOGPROBS not in batch.keys()  # then taken here (workers.old_logprobs)
        if take_old and not self.strategy.takes_old_logprobs:
            raise ValueError(f"{type(self.strategy).__name__} needs the batch's old_logprobs (compute_logprobs)")
        extra = (
            ((Batch.INFER_LOGPROBS,) if tis_level or correction or take_old else ())
            + ((Batch.OLD_LOGPROBS,) if not take_old else ())
            + (("episode_scores",) if pg_variant == "topr" else ())
            + ((Batch.REF_LOGPROBS,) if kl_loss_coef is not None else ())
            # the version of each token: train_infer_correction's segments end where it changes
            + ((Batch.POLICY_VERSION,) if correction and Batch.POLICY_VERSION in batch.keys() else ())
        )
        batch = model_inputs(batch, *TRAIN_KEYS, *extra)
        options = replace(
            pg_options or PGOptions(), clip_low=pg_clip, clip_high=pg_clip if pg_clip_high is None else pg_clip_high
        )
        loss_fn = partial(
            _policy_loss,
            temperature=temperature,
            pg_variant=pg_variant,
            pg_options=options,
            kl_loss_coef=kl_loss_coef,
            kl_loss_type=kl_loss_type,
            entropy_loss_coef=entropy_loss_coef,
            loss_agg_mode=loss_agg_mode,
            dedupe=self.strategy.dedupe_rows,
            tis_level=tis_level,
            tis_cap=tis_cap,
            correction=correction,
        )
        weight_by = "tokens" if loss_agg_mode == "token-mean" else "rows"
        per_step, old_metrics = self._optimizer_steps(batch, loss_fn, weight_by, temperature, ppo_epochs, step)
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
    model: nn.Module,
    micro: TensorDict,
    *,
    temperature: float,
    pg_variant: str,
    pg_options: PGOptions,
    entropy_loss_coef: float,
    loss_agg_mode: AggMode,
    dedupe: bool,
    tis_level: TISLevel | None,
    tis_cap: float | None,
    kl_loss_coef: float | None = None,
    kl_loss_type: KLKind = "low_var_kl",
    correction: dict | None = None,
    old: OldLogprobs | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """`pg_variant`'s loss (importance-weighted if `tis_level`), plus kl_loss_coef * KL to the
    reference when `kl_loss_coef` is set, minus the entropy bonus, on one micro-batch; metrics as
    floats. The old log-probs are the micro-batch's, or with `old` (the first optimizer step of a
    call that takes them itself) this forward's own, detached."""
    logprobs, entropy = token_logprobs(
        model,
        micro["input_ids"],
        micro["attention_mask"],
        temperature,
        with_entropy=True,
        dedupe=dedupe,
        images=row_images(micro),
        scored=micro[Batch.RESPONSE_MASK],
    )
    mask = micro[Batch.RESPONSE_MASK]
    old_logprobs = micro[Batch.OLD_LOGPROBS] if old is None else old.take(micro, logprobs)
    weights, extra_metrics = None, {}
    if tis_level is not None:
        weights = truncated_importance_weights(
            old_logprobs, micro[Batch.INFER_LOGPROBS], mask, level=tis_level, cap=tis_cap
        )
    if correction is not None:
        versions = micro[Batch.POLICY_VERSION] if Batch.POLICY_VERSION in micro.keys() else None
        weights, keep, extra_metrics = train_infer_correction(
            old_logprobs, micro[Batch.INFER_LOGPROBS], mask, **correction, versions=versions
        )
        mask = mask * keep
    pg_loss, metrics = policy_gradient_loss(
        pg_variant,
        logprobs,
        old_logprobs,
        micro[Batch.ADVANTAGES],
        mask,
        options=pg_options,
        loss_agg_mode=loss_agg_mode,
        weights=weights,
        episode_scores=micro["episode_scores"] if "episode_scores" in micro.keys() else None,
    )
    loss = pg_loss - entropy_loss_coef * agg_loss(entropy, mask, loss_agg_mode)
    if kl_loss_coef is not None:
        kl_term, kl_metrics = kl_loss(logprobs, micro[Batch.REF_LOGPROBS], mask, kl_loss_type, loss_agg_mode)
        loss = loss + kl_loss_coef * kl_term
        metrics.update(kl_metrics)
    metrics = {key: float(value) for key, value in metrics.items()}
    if tis_level is not None:
        metrics.update(tis_metrics(weights, mask, tis_cap))
    metrics.update(extra_metrics)
    metrics["losses/entropy"] = float(masked_mean(entropy.detach(), mask))
    return loss, metrics


PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")
"""A multimodal model's processor files besides its tokenizer's (copied into each checkpoint)."""


def _load_tokenizer(model_path: str) -> PreTrainedTokenizerBase | None:
    """The base model's tokenizer, so checkpoints are complete HF dirs; None if it has none."""
    if not any((Path(model_path) / name).exists() for name in TOKENIZER_FILES):
        return None
    return load_tokenizer(model_path)
