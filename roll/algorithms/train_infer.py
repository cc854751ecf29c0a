"""Train-infer correction, ROLL's `train_infer_correction`: importance weights and token filters
from the gap between the trainer's log-probs (`old_logprobs`, pi_old) and the engine's
(`infer_logprobs`, mu, the policy that sampled).

Per token, ratio = exp(old - infer) and diff = exp(old) - exp(infer). Each is also aggregated,
then repeated on the positions it covers:
- "token": the token's own value;
- "segment": the mean over a run of consecutive response tokens sampled by one policy version
  (one turn of a multi-turn row, or the part of a turn a version sampled when partial rollout
  continued it under new weights); the ratio is exp of the segment's mean log-ratio;
- "geometric": over the row: exp of the mean log-ratio (the diff: the mean diff);
- "sequence": over the row: exp of the summed log-ratio (the diff: the summed diff).

The importance weight (`is_weight`) multiplies the policy-gradient term, clamped at `upper_bound`
and detached. Each filter keeps the positions whose ratio (and/or diff) at its level lies within
[low, high]; the filters multiply into one keep-mask that is taken out of the response mask, so a
filtered token contributes neither loss nor normaliser. Metrics are computed whether or not a
correction is applied, as in ROLL.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from roll.algorithms.utils import masked_mean, masked_sum

LEVELS = ("token", "segment", "geometric", "sequence")


def segment_mean(values: Tensor, mask: Tensor, versions: Tensor | None = None) -> Tensor:
    """(B, T): on each run of consecutive mask-1 positions, the mean of `values` over that run;
    0 outside the mask. With `versions` (B, T), a run also ends where the version changes."""
    m = mask.to(torch.long)
    starts = m * (1 - torch.nn.functional.pad(m, (1, 0))[:, :-1])  # 1 where a run begins
    if versions is not None:  # ... or where another version's tokens begin inside one
        changed = (versions[:, 1:] != versions[:, :-1]).to(torch.long)
        starts = torch.maximum(starts, m * torch.nn.functional.pad(changed, (1, 0)))
    run = torch.cumsum(starts, dim=-1) * m  # 1, 2, ... per row inside runs, 0 outside
    width = run.shape[-1] + 1
    flat = (run + torch.arange(run.shape[0], device=run.device).unsqueeze(-1) * width).flatten()
    sums = torch.zeros(run.shape[0] * width, dtype=values.dtype, device=values.device)
    counts = torch.zeros_like(sums)
    sums.index_add_(0, flat, (values * m).flatten())
    counts.index_add_(0, flat, m.flatten().to(values.dtype))
    mean = sums / counts.clamp(min=1)
    return mean[flat].view_as(values) * m


def ratios_and_diffs(
    old_logprobs: Tensor, infer_logprobs: Tensor, mask: Tensor, versions: Tensor | None = None
) -> dict[str, dict[str, Tensor]]:
    """{"ratio": {level: (B, T)}, "diff": {level: (B, T)}} for every level of the module docstring;
    `versions` (B, T): the policy version of each token, where segments split too."""
    log_ratio = old_logprobs - infer_logprobs
    diff = old_logprobs.exp() - infer_logprobs.exp()

    def per_row(x: Tensor, reduce) -> Tensor:
        return reduce(x, mask, dim=-1).unsqueeze(-1).expand_as(x)

    return {
        "ratio": {
            "token": log_ratio.exp(),
            "segment": segment_mean(log_ratio, mask, versions).exp(),
            "geometric": per_row(log_ratio, masked_mean).exp(),
            "sequence": per_row(log_ratio, masked_sum).exp(),
        },
        "diff": {
            "token": diff,
            "segment": segment_mean(diff, mask, versions),
            "geometric": per_row(diff, masked_mean),
            "sequence": per_row(diff, masked_sum),
        },
    }


@torch.no_grad()
def train_infer_correction(
    old_logprobs: Tensor,
    infer_logprobs: Tensor,
    mask: Tensor,
    *,
    is_weight: dict[str, Any] | None,
    filters: Sequence[dict[str, Any]],
    versions: Tensor | None = None,
) -> tuple[Tensor | None, Tensor, dict[str, float]]:
    """(weights or None, keep-mask (B, T) of 0/1, metrics).

    `is_weight`: {"weight_type": level, "upper_bound": float or None} or None (no weights).
    `filters`: dicts with agg_type, ratio_enabled, ratio_low, ratio_high, diff_enabled, diff_low,
    diff_high (only the enabled filters are passed). `versions` (B, T): the policy version that
    sampled each token (`Batch.POLICY_VERSION`), so that a segment never spans two versions."""
    mask = mask.to(old_logprobs.dtype)
    stats = ratios_and_diffs(old_logprobs, infer_logprobs, mask, versions)
    metrics = {
        f"actor/train_infer_{kind}_{level}_mean": float(masked_mean(stats[kind][level], mask))
        for kind in ("ratio", "diff")
        for level in LEVELS
    }
    weights = None
    if is_weight is not None:
        weights = stats["ratio"][is_weight["weight_type"]]
        bound = is_weight.get("upper_bound")
        if bound is not None:
            metrics["actor/is_weight_clipfrac"] = float(masked_mean((weights > bound).to(mask.dtype), mask))
            weights = weights.clamp(min=0.0, max=bound)
    keep = torch.ones_like(mask)
    for rule in filters:
        level = rule["agg_type"]
        for kind in ("ratio", "diff"):
            if rule[f"{kind}_enabled"]:
                value = stats[kind][level]
                passed = ((value >= rule[f"{kind}_low"]) & (value <= rule[f"{kind}_high"])).to(mask.dtype)
                metrics[f"actor/train_infer_{level}_{kind}_mask_mean"] = float(masked_mean(passed, mask))
                keep = keep * passed
    if filters:
        metrics["actor/train_infer_final_mask_mean"] = float(masked_mean(keep, mask))
    return weights, keep, metrics
