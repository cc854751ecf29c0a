"""PPO actor and critic losses over (B, T) token tensors, and the quantities they need.

Variants implemented, and where they differ from the papers:
- `ppo_policy_loss` — the clipped surrogate of PPO (Schulman et al. 2017) per token:
  -min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A), with r = exp(logprobs - old_logprobs).
  `clip_high` above `clip_low` is DAPO's "clip-higher" (Yu et al. 2025); equal values are the
  paper. No dual clip and no clamp of the log-ratio: a huge ratio with a negative advantage gives a
  huge loss, as in the paper. Optional per-token `weights` (truncated importance weights of
  `off_policy.py`) multiply each token's term before aggregation.
- `value_loss` — PPO2 / CleanRL value clipping: 0.5 * max((V - R)^2, (V_clip - R)^2) with
  V_clip = V_old + clip(V - V_old, -clip, clip). The paper itself uses the unclipped error.
- `agg_loss` — how token losses become one scalar, with verl's mode names. Sequences without a
  generated token are left out of the per-sequence means (they would pull the mean to 0).

Metrics are Python floats named as CleanRL names them ("losses/approx_kl", "losses/clipfrac").
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

from roll.algorithms.utils import masked_mean, masked_sum

AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]


CHUNK_ELEMENTS = 2**24
"""Logits elements (64 MiB in float32) scored at a time by `logprobs_from_logits` and
`entropy_from_logits` (and roll.distributed.micro_batches): whole rows, at least one."""


def row_chunks(logits: Tensor, max_elements: int = CHUNK_ELEMENTS) -> list[Tensor]:
    """`logits` (B, ...) split along B into runs of whole rows of at most `max_elements` elements
    (one row where a row alone is larger): each op on a chunk is one kernel launch for many rows,
    while the temporaries a chunk makes stay bounded."""
    per_row = max(1, logits[0].numel()) if len(logits) else 1
    return list(logits.split(max(1, max_elements // per_row)))


def logprobs_from_logits(logits: Tensor, labels: Tensor) -> Tensor:
    """log softmax(logits)[label] per position. logits (B, T, V), labels (B, T) -> (B, T).

    The caller aligns them: logits at position t score token t+1, so pass
    `logits[:, :-1]` with `input_ids[:, 1:]`. Rows are scored a chunk at a time (`row_chunks`:
    logsumexp minus the gathered logit), so that no second (B, T, V) tensor is ever held, which
    log_softmax would make. bf16 / fp16 logits are scored in float32 (their log-probs would be too
    coarse for PPO ratios).
    """
    dtype = torch.promote_types(logits.dtype, torch.float32)
    rows = []
    chunks = row_chunks(logits)
    for chunk_logits, chunk_labels in zip(chunks, labels.split([len(c) for c in chunks]), strict=True):
        chunk = chunk_logits.to(dtype)
        picked = chunk.gather(-1, chunk_labels.unsqueeze(-1)).squeeze(-1)
        rows.append(picked - torch.logsumexp(chunk, dim=-1))
    return torch.cat(rows) if rows else logits.new_zeros(labels.shape, dtype=dtype)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) per position. logits (..., V) -> (...), e.g. (B, T, V) -> (B, T).

    H = logsumexp(l) - sum(softmax(l) * l), a chunk of rows at a time (`row_chunks`) and in at
    least float32, like `logprobs_from_logits`.
    """
    dtype = torch.promote_types(logits.dtype, torch.float32)
    rows = []
    for chunk_logits in row_chunks(logits):
        chunk = chunk_logits.to(dtype)
        probs = torch.softmax(chunk, dim=-1)
        rows.append(torch.logsumexp(chunk, dim=-1) - (probs * chunk).sum(dim=-1))
    return torch.cat(rows) if rows else logits.new_zeros(logits.shape[:-1], dtype=dtype)


def agg_loss(loss_mat: Tensor, mask: Tensor, mode: AggMode) -> Tensor:
    """Reduce per-token losses (B, T) over masked tokens to a scalar.

    "token-mean": sum over all masked tokens / their count (long answers weigh more).
    "seq-mean-token-mean": mean over tokens within each sequence, then mean over sequences.
    "seq-mean-token-sum": sum over tokens within each sequence, then mean over sequences.
    """
    if mode == "token-mean":
        return masked_mean(loss_mat, mask)
    has_tokens = (mask.sum(dim=-1) > 0).to(loss_mat.dtype)
    if mode == "seq-mean-token-mean":
        return masked_mean(masked_mean(loss_mat, mask, dim=-1), has_tokens)
    if mode == "seq-mean-token-sum":
        return masked_mean(masked_sum(loss_mat, mask, dim=-1), has_tokens)
    raise ValueError(f"unknown loss_agg_mode {mode!r}; choose one of {list(get_args(AggMode))}")


def ppo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    clip_low: float,
    clip_high: float | None = None,
    loss_agg_mode: AggMode = "token-mean",
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped PPO surrogate loss. All inputs (B, T); gradients flow through `logprobs` only.

    clip_high None means symmetric clipping (clip_high = clip_low). `weights` (B, T), detached,
    scale each token's term (off-policy correction); None weighs every token 1.
    Metrics: "losses/policy_loss"; "losses/clipfrac", the fraction of tokens whose clipped term
    is the one taken (their gradient is zero); "losses/approx_kl", the k3 estimate
    mean((r - 1) - log r) of KL(old || new); "losses/ratio_mean", the masked mean of r.
    """
    clip_high = clip_low if clip_high is None else clip_high
    log_ratio = logprobs - old_logprobs.detach()
    advantages = advantages.detach()
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    token_loss = torch.maximum(unclipped, clipped)
    if weights is not None:
        token_loss = token_loss * weights.detach()
    loss = agg_loss(token_loss, response_mask, loss_agg_mode)
    with torch.no_grad():
        clipped_taken = (clipped > unclipped).to(ratio.dtype)
        metrics = {
            "losses/policy_loss": loss.item(),
            "losses/clipfrac": masked_mean(clipped_taken, response_mask).item(),
            "losses/approx_kl": masked_mean((ratio - 1.0) - log_ratio, response_mask).item(),
            "losses/ratio_mean": masked_mean(ratio, response_mask).item(),
        }
    return loss, metrics


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    response_mask: Tensor,
    clip: float | None,
    loss_agg_mode: AggMode = "token-mean",
) -> tuple[Tensor, dict[str, float]]:
    """Critic loss 0.5 * max((V - R)^2, (V_clip - R)^2); with `clip` None, 0.5 * (V - R)^2.

    values (B, T) carries gradients; old_values and returns (B, T) are targets.
    Metrics: "losses/value_loss"; "losses/value_clipfrac", the fraction of tokens whose clipped
    error is the larger (their gradient is zero).
    """
    error = (values - returns) ** 2
    if clip is None:
        loss_mat, clipped_taken = error, torch.zeros_like(error, dtype=torch.bool)
    else:
        clipped_values = old_values + torch.clamp(values - old_values, -clip, clip)
        clipped_error = (clipped_values - returns) ** 2
        loss_mat, clipped_taken = torch.maximum(error, clipped_error), clipped_error > error
    loss = 0.5 * agg_loss(loss_mat, response_mask, loss_agg_mode)
    metrics = {
        "losses/value_loss": loss.item(),
        "losses/value_clipfrac": masked_mean(clipped_taken.to(values.dtype), response_mask).item(),
    }
    return loss, metrics
