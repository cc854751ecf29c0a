"""Micro-batch helpers shared by every training strategy and worker role.

A batch is a `tensordict.TensorDict` with batch_size [B] whose per-token tensors are (B, T),
RIGHT-padded and aligned to token positions. Everything here keeps that alignment: position t of
every output describes token t of `input_ids`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from tensordict import TensorDict
from torch import nn

from roll.algorithms.losses import entropy_from_logits, logprobs_from_logits

MicroForward = Callable[[nn.Module, TensorDict], dict[str, torch.Tensor]]


def valid_length(attention_mask: torch.Tensor) -> int:
    """Index after the last attended position of any row of `attention_mask` (B, T).

    Right padding means every column past this index is padding in every row, so it can be cut
    off before the forward pass without changing any real token's output (causal attention).
    """
    attended_columns = attention_mask.bool().any(dim=0).nonzero()
    return int(attended_columns[-1]) + 1 if len(attended_columns) else 1


def trim_padding(batch: TensorDict) -> TensorDict:
    """Cut the columns that are padding in every row from every per-token (B, T) tensor."""
    length = valid_length(batch["attention_mask"])
    total = batch["attention_mask"].shape[1]
    return batch.apply(lambda x: x[:, :length] if x.dim() >= 2 and x.shape[1] == total else x)


def pad_right(x: torch.Tensor, length: int) -> torch.Tensor:
    """Zero-pad (b, t) to (b, length) on the right: the inverse of `trim_padding`."""
    return F.pad(x, (0, length - x.shape[1]))


def iter_micro_batches(batch: TensorDict, micro_batch_size: int) -> Iterator[TensorDict]:
    """Consecutive row slices of at most `micro_batch_size` rows, each trimmed to its padding."""
    for start in range(0, batch.batch_size[0], micro_batch_size):
        yield trim_padding(batch[start : start + micro_batch_size])


def token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (B, T) and optionally entropies (B, T) of a causal LM, with grad.

    logprobs[:, t] = log p(input_ids[:, t] | input_ids[:, :t]) under logits / temperature, the
    distribution the token was sampled from; entropy[:, t] is that distribution's entropy.
    Column 0 has no predecessor and is 0, as are padding positions (attention_mask == 0).
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]
    logits = logits.float() / temperature
    mask = attention_mask[:, 1:].to(logits.dtype)
    logprobs = F.pad(logprobs_from_logits(logits, input_ids[:, 1:]) * mask, (1, 0))
    if not with_entropy:
        return logprobs, None
    return logprobs, F.pad(entropy_from_logits(logits) * mask, (1, 0))


def shifted_values(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Values (B, T) of a value model (logits (B, T, 1)), aligned like `token_logprobs`.

    values[:, t] = V(input_ids[:, :t]): the value of the state in which token t was generated,
    i.e. the head's output at position t - 1. Column 0 and padding positions are 0.
    """
    head = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1, 0].float()
    return F.pad(head * attention_mask[:, 1:].to(head.dtype), (1, 0))


@torch.no_grad()
def forward_in_micro_batches(
    model: nn.Module, batch: TensorDict, forward: MicroForward, micro_batch_size: int, device: torch.device
) -> dict[str, torch.Tensor]:
    """Run `forward(model, micro)` over micro-batches without grad; outputs (B, T) on CPU.

    Each micro-batch is trimmed to its longest row, so short rows do not pay for the longest one
    in the whole batch; outputs are zero-padded back to the batch's T and concatenated.
    """
    total = batch["input_ids"].shape[1]
    parts: dict[str, list[torch.Tensor]] = {}
    for micro in iter_micro_batches(batch, micro_batch_size):
        for key, value in forward(model, micro.to(device)).items():
            parts.setdefault(key, []).append(pad_right(value.float().cpu(), total))
    return {key: torch.cat(values) for key, values in parts.items()}
