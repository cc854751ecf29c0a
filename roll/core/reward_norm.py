"""ROLL's reward-normalisation vocabulary as data: the statistics each `method` implies, and where
"asym_clip" clamps. Read by the config (`roll.configs.reward_norm.RewardNormalization`) and by the
algorithm (`roll.algorithms.reward_norm`), so it lives on the floor both stand on."""

from __future__ import annotations

from typing import Literal

NormType = Literal["batch", "group"] | None
NORM_TYPES: tuple[NormType, ...] = ("batch", "group", None)
NormMethod = Literal["identity", "mean", "mean_std", "asym_clip"]
ASYM_CLIP_RANGE = (-1.0, 3.0)
"""Where "asym_clip" clamps normalised scores: a bad outcome weighs at most 1 std, a good one 3."""


def norm_types_for_method(method: NormMethod, grouping: str) -> tuple[NormType, NormType]:
    """(norm_mean_type, norm_std_type) that ROLL derives from `method` and `grouping`
    (`_resolve_reward_norm_defaults`): batch statistics for grouping "batch", else the group's."""
    kind: NormType = "batch" if grouping == "batch" else "group"
    table: dict[str, tuple[NormType, NormType]] = {
        "identity": (None, None),
        "mean": (kind, None),
        "mean_std": (kind, kind),
        "asym_clip": (kind, kind),
    }
    if method not in table:
        raise ValueError(f"unknown reward normalisation method {method!r}; choose one of {sorted(table)}")
    return table[method]
