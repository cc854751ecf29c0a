"""Micro-batch helpers shared by every training strategy and worker role.

A batch is a `tensordict.TensorDict` with batch_size [B] whose per-token tensors are (B, T),
RIGHT-padded and aligned to token positions. Everything here keeps that alignment: position t of
every output describes token t of `input_ids`.

Forward passes run the model once per DISTINCT row (`distinct_rows`). Agentic batches repeat rows
token for token: step-wise samples revisit the same states (a 4x4 FrozenLake map has at most 16,
and every rollout of a group starts from the same one), and trajectory-wise samples repeat once
the policy sharpens. A causal LM's output for a row depends only on that row's tokens and mask, so
the copies are computed once and expanded back with `index_select`; through autograd the copies'
gradients are summed, which is exactly the gradient of the full batch. Every row keeps its own
advantages, old log-probs and masks in the loss, so losses and gradients are unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch
import torch.nn.functional as F
from tensordict import TensorDict
from torch import nn

from roll.algorithms.losses import entropy_from_logits, logprobs_from_logits

MicroForward = Callable[[nn.Module, TensorDict], dict[str, torch.Tensor]]
"""`forward(model, micro) -> {name: (b, t)}`. A row's outputs must depend only on its own
`input_ids` and `attention_mask`: copies of a row are computed once (see module docstring)."""


class DistinctRows(NamedTuple):
    """The distinct rows of a batch of B rows, U of them: `rows == rows[index][inverse]`."""

    index: torch.Tensor
    """(U,) the first row of the batch holding each distinct row."""
    inverse: torch.Tensor
    """(B,) which distinct row each row of the batch is, an index into `index`."""

    @property
    def ratio(self) -> float:
        """Distinct rows / rows: about the share of the full forward work that is left."""
        return len(self.index) / max(len(self.inverse), 1)

    def expand(self, per_distinct: torch.Tensor) -> torch.Tensor:
        """(U, ...) -> (B, ...): every row gets its distinct row's values.

        Backward through `index_select` sums the gradients of all copies of a distinct row, which
        is what the same row repeated in the model's input would receive.
        """
        return per_distinct.index_select(0, self.inverse)


def distinct_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> DistinctRows:
    """Group the rows of `input_ids` (B, T) that are token-for-token identical.

    Two rows are the same when their attention masks are equal and their attended tokens are
    equal; ids under attention_mask == 0 are ignored (the model's output at real tokens does not
    see them, and outputs at padding are masked to 0). Exact comparison (`torch.unique`), no hash.
    """
    key = torch.where(attention_mask.bool(), input_ids, -1)
    distinct, inverse = torch.unique(key, dim=0, return_inverse=True)
    rows = torch.arange(len(inverse), device=inverse.device)
    first = torch.full((len(distinct),), len(inverse), dtype=rows.dtype, device=rows.device)
    return DistinctRows(first.scatter_reduce(0, inverse, rows, reduce="amin"), inverse)


def all_rows(num_rows: int, device: torch.device | str = "cpu") -> DistinctRows:
    """Every row its own distinct row: the grouping that turns deduplication off."""
    rows = torch.arange(num_rows, device=device)
    return DistinctRows(rows, rows)


def rows_to_compute(input_ids: torch.Tensor, attention_mask: torch.Tensor, dedupe: bool) -> DistinctRows:
    """`distinct_rows` with `dedupe`, else `all_rows`: the rows a forward pass runs the model on."""
    return distinct_rows(input_ids, attention_mask) if dedupe else all_rows(len(input_ids), input_ids.device)


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


def iter_distinct_micro_batches(
    batch: TensorDict, micro_batch_size: int, rows: DistinctRows
) -> Iterator[TensorDict]:
    """Micro-batches of at most `micro_batch_size` distinct rows each, holding every copy of them.

    Gathering all copies of a row into one micro-batch lets a single forward pass serve every copy
    in the whole mini-batch, not only the copies that happen to share a micro-batch. The model
    still sees at most `micro_batch_size` rows per pass; the copies cost only their (rows, T) loss
    tensors. Rows keep their batch order within a micro-batch; each is trimmed to its padding.
    With `all_rows(B)` this is `iter_micro_batches`.
    """
    for start in range(0, len(rows.index), micro_batch_size):
        members = (rows.inverse >= start) & (rows.inverse < start + micro_batch_size)
        yield trim_padding(batch[members])


def token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float,
    with_entropy: bool = False,
    dedupe: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (B, T) and optionally entropies (B, T) of a causal LM, with grad.

    logprobs[:, t] = log p(input_ids[:, t] | input_ids[:, :t]) under logits / temperature, the
    distribution the token was sampled from; entropy[:, t] is that distribution's entropy.
    Column 0 has no predecessor and is 0, as are padding positions (attention_mask == 0).
    The model runs once per distinct row (module docstring); `dedupe=False` runs it on every row,
    with the same results, to measure what that saves.
    """
    rows = rows_to_compute(input_ids, attention_mask, dedupe)
    logprobs, entropy = _token_logprobs(
        model, input_ids[rows.index], attention_mask[rows.index], temperature, with_entropy
    )
    return rows.expand(logprobs), None if entropy is None else rows.expand(entropy)


def _token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`token_logprobs` of every row as given, copies included."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]
    logits = logits.float() / temperature
    mask = attention_mask[:, 1:].to(logits.dtype)
    logprobs = F.pad(logprobs_from_logits(logits, input_ids[:, 1:]) * mask, (1, 0))
    if not with_entropy:
        return logprobs, None
    return logprobs, F.pad(entropy_from_logits(logits) * mask, (1, 0))


def shifted_values(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, dedupe: bool = True
) -> torch.Tensor:
    """Values (B, T) of a value model (logits (B, T, 1)), aligned like `token_logprobs`.

    values[:, t] = V(input_ids[:, :t]): the value of the state in which token t was generated,
    i.e. the head's output at position t - 1. Column 0 and padding positions are 0.
    Once per distinct row, as `token_logprobs`.
    """
    rows = rows_to_compute(input_ids, attention_mask, dedupe)
    input_ids, attention_mask = input_ids[rows.index], attention_mask[rows.index]
    head = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1, 0].float()
    return rows.expand(F.pad(head * attention_mask[:, 1:].to(head.dtype), (1, 0)))


@torch.no_grad()
def forward_in_micro_batches(
    model: nn.Module,
    batch: TensorDict,
    forward: MicroForward,
    micro_batch_size: int,
    device: torch.device,
    dedupe: bool = True,
) -> dict[str, torch.Tensor]:
    """Run `forward(model, micro)` over micro-batches without grad; outputs (B, T) on CPU.

    With `dedupe`, only the distinct rows of the whole batch are run (see `MicroForward`), then
    copied back to every row. Each micro-batch is trimmed to its longest row, so short rows do not
    pay for the longest one in the whole batch; outputs are zero-padded back to the batch's T.
    """
    total = batch["input_ids"].shape[1]
    rows = rows_to_compute(batch["input_ids"], batch["attention_mask"], dedupe)
    parts: dict[str, list[torch.Tensor]] = {}
    for micro in iter_micro_batches(batch[rows.index], micro_batch_size):
        for key, value in forward(model, micro.to(device)).items():
            parts.setdefault(key, []).append(pad_right(value.float().cpu(), total))
    return {key: rows.expand(torch.cat(values)) for key, values in parts.items()}
