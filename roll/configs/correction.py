"""Corrections for the gap between the trainer's and the engine's log-probs (data only):
`off_policy_correction` (truncated importance sampling, `roll.algorithms.off_policy`) and ROLL's
`train_infer_correction` (`roll.algorithms.train_infer`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from roll.configs.base import ConfigModel, InvalidField

Level = Literal["token", "segment", "geometric", "sequence"]


class OffPolicyCorrection(ConfigModel):
    """Truncated importance sampling of the policy-gradient loss by w = min(pi_old / mu, cap):
    pi_old the trainer's old log-probs, mu the engine's (the policy that actually sampled; see
    `roll.algorithms.off_policy`). Applies in synchronous training too, where the two differ by
    numerics only."""

    level: Literal["token", "sequence"] = "token"
    """"token": one weight per generated token; "sequence": one per row, the product of its
    tokens' ratios (exp of the summed log-ratio), before truncation."""
    cap: float = Field(2.0, gt=0)
    """Truncation: weights above `cap` are set to `cap` (bounds the variance)."""


class ISWeight(ConfigModel):
    """Importance weight exp(old - infer) at `weight_type`'s level, multiplying the
    policy-gradient term of each token."""

    enabled: bool = False
    """Off: every weight is 1 (the ratio metrics are still logged)."""
    weight_type: Level = "token"
    """"token", "segment" (one turn's run of response tokens), "geometric" (exp of the row's mean
    log-ratio) or "sequence" (exp of the row's summed log-ratio)."""
    upper_bound: float | None = Field(1.2, gt=0)
    """Weights above it are clamped to it; None: no clamp."""
    detach: bool = True
    """The weight carries no gradient (ROLL's default and the only sound choice here: the weight
    is computed from the stored old log-probs, which carry none); false is refused."""

    @model_validator(mode="after")
    def _detached(self) -> ISWeight:
        if not self.detach:
            raise InvalidField("detach", "false is not supported: the weight comes from stored log-probs")
        return self


class TokenFilter(ConfigModel):
    """Keeps the response tokens whose train/infer ratio exp(old - infer) and/or probability
    difference exp(old) - exp(infer), at `agg_type`'s level, lie within the bounds; the others
    leave the loss (and its normaliser)."""

    enabled: bool = False
    """Off: the rule is skipped."""
    agg_type: Level = "token"
    """The level the ratio and diff are taken at (as ISWeight.weight_type)."""
    ratio_enabled: bool = True
    """Filter on the ratio."""
    ratio_low: float = 0.8
    """Lowest ratio kept."""
    ratio_high: float = 1.2
    """Highest ratio kept."""
    diff_enabled: bool = False
    """Filter on the probability difference."""
    diff_low: float = -0.2
    """Lowest difference kept."""
    diff_high: float = 0.2
    """Highest difference kept."""

    @model_validator(mode="after")
    def _ordered(self) -> TokenFilter:
        for kind in ("ratio", "diff"):
            if getattr(self, f"{kind}_low") > getattr(self, f"{kind}_high"):
                raise InvalidField(f"{kind}_low", f"is above {kind}_high: the rule would keep nothing")
        return self


class TrainInferCorrection(ConfigModel):
    """Weights and filters from the gap between the trainer's and the engine's log-probs."""

    is_weight: ISWeight = Field(default_factory=ISWeight)
    """The importance weight."""
    filters: list[TokenFilter] = Field(default_factory=list)
    """Rules applied one after the other; a token must pass every enabled one."""

    def loss_options(self) -> dict | None:
        """What the actor's loss needs (plain data), or None when nothing is applied."""
        weight = self.is_weight
        rules = [f.model_dump(exclude={"enabled"}) for f in self.filters if f.enabled]
        if not weight.enabled and not rules:
            return None
        return {
            "is_weight": {"weight_type": weight.weight_type, "upper_bound": weight.upper_bound}
            if weight.enabled
            else None,
            "filters": rules,
        }
