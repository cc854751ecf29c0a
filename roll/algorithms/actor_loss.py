"""The actor's whole loss on one micro-batch, and the options that choose it (`PolicyLossOptions`).

`actor_loss` = `pg_variant`'s policy-gradient loss (`pg_variants`; importance-weighted by
`off_policy`'s truncated weights or `train_infer`'s correction when on) - entropy_coef * entropy
(aggregated like the policy loss) + kl_coef * KL(pi || reference) (`kl.kl_loss`) when `kl_coef` is
set. Contract: `PolicyLossOptions` is built once per run from the config at the edge
(`roll.pipeline.setup.builders.build_loss_options`) and passed whole from the pipeline through the actor
worker to this function; nothing on the way repacks it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from torch import Tensor

from roll.algorithms.kl import KLKind, kl_loss
from roll.algorithms.losses import AggMode, agg_loss
from roll.algorithms.off_policy import TISLevel, tis_metrics, truncated_importance_weights
from roll.algorithms.pg_variants import PGOptions, policy_gradient_loss
from roll.algorithms.schedules import Schedule, scheduled
from roll.algorithms.train_infer import train_infer_correction
from roll.algorithms.utils import masked_mean
from roll.core.fields import Batch


@dataclass(frozen=True)
class PolicyLossOptions:
    """What the actor's loss is, for a whole run (the config keys in brackets)."""

    temperature: float = 1.0
    """Sampling temperature the log-probs are taken at (actor_infer.generating_args)."""
    variant: str = "ppo"
    """The policy-gradient variant (actor_train.pg_variant), `pg_variants.PG_VARIANTS`."""
    pg: PGOptions = PGOptions()
    """The variant's parameters, the PPO clip range included."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (entropy_loss_coef); with a schedule, its weight at step 1."""
    entropy_schedule: Schedule = "constant"
    """How that weight changes over the run (entropy_loss_coef_schedule): `at_step` applies it."""
    max_steps: int = 1
    """The run's steps (max_steps), where a decaying schedule reaches 0."""
    agg_mode: AggMode = "token-mean"
    """How token losses become one number (loss_agg_mode)."""
    tis_level: TISLevel | None = None
    """Truncated importance weights per "token" or "sequence" (off_policy_correction); None: off."""
    tis_cap: float = 2.0
    """Their truncation (off_policy_correction.cap)."""
    kl_coef: float | None = None
    """Weight of the KL-to-reference loss (kl_loss_coef with use_kl_loss); None: no KL loss."""
    kl_kind: KLKind = "low_var_kl"
    """Its estimator (kl_loss_type)."""
    correction: Mapping[str, Any] | None = None
    """train_infer_correction's weights and filters (`TrainInferCorrection.loss_options()`)."""

    def at_step(self, step: int) -> PolicyLossOptions:
        """The options of pipeline step `step`: the entropy weight its schedule gives there, fixed
        (a constant schedule; so applying it twice changes nothing)."""
        if self.entropy_schedule == "constant":
            return self
        weight = scheduled(self.entropy_coef, self.entropy_schedule, step, self.max_steps)
        return replace(self, entropy_coef=weight, entropy_schedule="constant")

    def batch_fields(self, takes_old: bool, has_versions: bool) -> tuple[str, ...]:
        """The batch fields the loss reads besides TRAIN_KEYS: the engine's log-probs for a
        correction (and when the actor takes the old log-probs itself, `takes_old`), the old
        log-probs otherwise, episode scores for "topr", reference log-probs for the KL loss, and
        each token's policy version for the correction's segments (when the batch has them)."""
        return (
            ((Batch.INFER_LOGPROBS,) if self.tis_level or self.correction or takes_old else ())
            + ((Batch.OLD_LOGPROBS,) if not takes_old else ())
            + (("episode_scores",) if self.variant == "topr" else ())
            + ((Batch.REF_LOGPROBS,) if self.kl_coef is not None else ())
            # the version of each token: train_infer_correction's segments end where it changes
            + ((Batch.POLICY_VERSION,) if self.correction and has_versions else ())
        )


def actor_loss(
    logprobs: Tensor, entropy: Tensor, old_logprobs: Tensor, micro: Mapping[str, Tensor], options: PolicyLossOptions
) -> tuple[Tensor, dict[str, float]]:
    """The loss (scalar) and its metrics as floats.

    logprobs, entropy (B, T) of this forward (with gradients); old_logprobs (B, T); `micro` holds
    response_mask, advantages (B, T) and the fields of `options.batch_fields`."""
    mask = micro[Batch.RESPONSE_MASK]
    weights, keep, extra_metrics = _token_weights(old_logprobs, mask, micro, options)
    if keep is not None:
        mask = mask * keep
    pg_loss, metrics = policy_gradient_loss(
        options.variant,
        logprobs,
        old_logprobs,
        micro[Batch.ADVANTAGES],
        mask,
        options=options.pg,
        loss_agg_mode=options.agg_mode,
        weights=weights,
        episode_scores=_optional(micro, "episode_scores"),
    )
    loss = pg_loss - options.entropy_coef * agg_loss(entropy, mask, options.agg_mode)
    if options.kl_coef is not None:
        kl_term, kl_metrics = kl_loss(logprobs, micro[Batch.REF_LOGPROBS], mask, options.kl_kind, options.agg_mode)
        loss = loss + options.kl_coef * kl_term
        metrics.update(kl_metrics)
    metrics = {key: float(value) for key, value in metrics.items()}
    if options.tis_level is not None:
        assert weights is not None
        metrics.update(tis_metrics(weights, mask, options.tis_cap))
    metrics.update(extra_metrics)
    metrics["losses/entropy"] = float(masked_mean(entropy.detach(), mask))
    return loss, metrics


def _token_weights(
    old_logprobs: Tensor, mask: Tensor, micro: Mapping[str, Tensor], options: PolicyLossOptions
) -> tuple[Tensor | None, Tensor | None, dict[str, float]]:
    """Off-policy weights (B, T) or None, the correction's keep-mask or None, and its metrics."""
    weights, keep = None, None
    metrics: dict[str, float] = {}
    if options.tis_level is not None:
        infer = micro[Batch.INFER_LOGPROBS]
        weights = truncated_importance_weights(old_logprobs, infer, mask, level=options.tis_level, cap=options.tis_cap)
    if options.correction is not None:
        versions = _optional(micro, Batch.POLICY_VERSION)
        weights, keep, metrics = train_infer_correction(
            old_logprobs, micro[Batch.INFER_LOGPROBS], mask, **options.correction, versions=versions
        )
    return weights, keep, metrics


def _optional(micro: Mapping[str, Tensor], key: str) -> Tensor | None:
    return micro[key] if key in micro.keys() else None
