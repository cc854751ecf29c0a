"""ROLL's `reward_normalization` block. Its vocabulary (the statistics each `method` implies, where
"asym_clip" clamps) is `roll.core.reward_norm`, shared with `roll.algorithms.reward_norm`."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from roll.configs.base import ConfigModel
from roll.core.reward_norm import ASYM_CLIP_RANGE, norm_types_for_method


class RewardNormalization(ConfigModel):
    """ROLL's `reward_normalization`: rescale each trajectory's episode score before the
    advantage estimator (see `roll.algorithms.reward_norm`)."""

    grouping: Literal["traj_group_id", "tag", "tags", "batch"] = "traj_group_id"
    """Rows with equal values of this key form a group: the trajectories of one env seed
    ("traj_group_id"), of one env tag ("tags", ROLL's spelling, or "tag"), or the whole batch
    ("batch")."""
    method: Literal["identity", "mean", "mean_std", "asym_clip"] | None = None
    """ROLL's shorthand for the two types below, used for each one the YAML leaves out: "identity"
    neither, "mean" subtracts the mean, "mean_std" and "asym_clip" also divide by the std (of the
    batch for grouping "batch", else of the group); "asym_clip" then clamps to [-1, 3]. null: the
    types below as given (defaults: the group mean, no std)."""
    norm_mean_type: Literal["batch", "group"] | None = "group"
    """Subtract the mean of the whole batch, of the row's group, or nothing (null)."""
    norm_std_type: Literal["batch", "group"] | None = None
    """Divide by the std (+1e-6) of the whole batch, of the row's group, or nothing (null)."""

    @model_validator(mode="after")
    def _types_from_method(self) -> RewardNormalization:
        """The one place where `method` becomes the two norm types (the explicit ones win, as in ROLL)."""
        if self.method is not None:
            mean_type, std_type = norm_types_for_method(self.method, self.grouping)
            if "norm_mean_type" not in self.model_fields_set:
                self.norm_mean_type = mean_type
            if "norm_std_type" not in self.model_fields_set:
                self.norm_std_type = std_type
        return self

    @property
    def group_key(self) -> str:
        """The batch's non-tensor key that holds the groups ("tags" is ROLL's name of "tag")."""
        return "tag" if self.grouping == "tags" else self.grouping

    @property
    def clip_range(self) -> tuple[float, float] | None:
        """Where normalised scores are clamped: [-1, 3] for "asym_clip", else nowhere."""
        return ASYM_CLIP_RANGE if self.method == "asym_clip" else None
