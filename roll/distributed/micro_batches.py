"""Micro-batch helpers shared by every training strategy and worker role.

A batch is a `tensordict.TensorDict` with batch_size [B] whose per-token tensors are (B, T),
RIGHT-padded and aligned to token positions. Everything here keeps that alignment: position t of
every output describes token t of `input_ids`.

Forward passes run the model once per DISTINCT row (`distinct_rows`), where two rows are the same
when they differ at most in their last real token. A causal LM's output at position t depends only
on the row's tokens up to t and its mask, and the output at the last real position is never used:
logprobs[:, t] and entropy[:, t] come from the logits at t - 1, values[:, t] from the head at t - 1.
The last real token is only ever a label. Agentic batches repeat rows up to that label: step-wise
samples revisit the same states (a 4x4 FrozenLake map has at most 16, and every rollout of a
group starts from the same one) and answer them with different one-token actions, and
trajectory-wise samples repeat once the policy sharpens.

So the model runs on one representative row per distinct row, (U, T), and every row of the batch
(B, T) reads its outputs from its representative's: values as they are (`expand`), log-probs by
gathering the row's OWN labels from the representative's per-position distribution; no (B, T, V)
tensor is made, and the output head runs only at the positions some row scores
(`roll.distributed.output_head`). Through autograd the contributions of all rows
sharing a representative are summed, which is exactly the gradient of the full batch. Every row
keeps its own labels, advantages, old log-probs and masks in the loss, so losses and gradients
are unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, cast

import torch
import torch.nn.functional as F
from tensordict import TensorDict
from torch import nn

from roll.algorithms.losses import entropy_from_logits, row_chunks
from roll.core.fields import Batch
from roll.distributed.dynamic_batching import TokenBudget, pad_to_multiple, row_lengths
from roll.distributed.output_head import logits_at
from roll.distributed.row_images import RowImages, row_images, vision_inputs
from roll.models.loading import vision_token_ids

MicroForward = Callable[[nn.Module, TensorDict], dict[str, torch.Tensor]]
"""`forward(model, micro) -> {name: (b, t)}`, one output row per row of `micro`. A micro-batch
holds every row sharing each of its distinct rows, so to run the model once per distinct row the
forward must deduplicate itself, as `token_logprobs` and `shifted_values` do."""

PADDING_KEY = -1
"""Stands for ids under attention_mask == 0 in the grouping key (token ids are >= 0)."""
LAST_TOKEN_KEY = -2
"""Stands for each row's last real token in the grouping key: a label only (module docstring)."""


class DistinctRows(NamedTuple):
    """The distinct rows of a batch of B rows, U of them: rows that share one forward pass.

    Row b and its representative, row index[inverse[b]], have equal attention masks and equal real
    tokens except maybe the last one (`distinct_rows`).
    """

    index: torch.Tensor  # type: ignore[assignment]  # a field named like tuple.index, which it hides
    """(U,) the first row of the batch holding each distinct row: its representative."""
    inverse: torch.Tensor
    """(B,) which distinct row each row of the batch is, an index into `index`."""

    @property
    def ratio(self) -> float:
        """Distinct rows / rows: about the share of the full forward work that is left."""
        return len(self.index) / max(len(self.inverse), 1)

    def expand(self, per_distinct: torch.Tensor) -> torch.Tensor:
        """(U, ...) -> (B, ...): every row gets its representative's values.

        Backward through `index_select` sums the gradients of all rows sharing a representative,
        which is what those rows, each in the model's input, would send into the shared positions.
        """
        return per_distinct.index_select(0, self.inverse)


def distinct_rows(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, images: RowImages | None = None
) -> DistinctRows:
    """Group the rows of `input_ids` (B, T) that a forward pass cannot tell apart.

    Two rows are the same when their attention masks are equal and their attended tokens are
    equal except the last one (a label only, module docstring). Ids under attention_mask == 0 are
    ignored (no real token's output sees them, and outputs at padding are masked to 0). The key
    writes both as negative sentinels, so equal keys mean equal masks. Distinct rows are numbered
    in the order of their first row; the grouping is exact (`group_equal_rows`).
    """
    attended = attention_mask.bool()
    last = attended & (attended.long().cumsum(dim=1) == attended.sum(dim=1, keepdim=True))
    key = torch.where(attended, input_ids, PADDING_KEY).masked_fill(last, LAST_TOKEN_KEY)
    if images is not None:  # rows with images: equal ids share only with equal images too
        key = torch.cat([key.long(), images.hashes.to(key.device)], dim=1)
    return group_equal_rows(key)


def group_equal_rows(key: torch.Tensor) -> DistinctRows:
    """The equal rows of an integer (B, T) tensor, numbered in the order of their first row.

    Rows are grouped by a 64-bit hash (a few whole-tensor ops, where `torch.unique(dim=0)` compares
    rows one pair at a time on the host), then every row is compared with its group's first row;
    should two different rows share a hash, the exact `torch.unique(dim=0)` groups them instead.
    """
    rows = torch.arange(len(key), device=key.device)
    if len(key) == 0:
        return DistinctRows(rows, rows)
    _, inverse = torch.unique(_row_hashes(key), return_inverse=True)
    first = _first_rows(inverse, rows)
    if not torch.equal(key, key[first[inverse]]):  # two different rows share a hash
        _, inverse = torch.unique(key, dim=0, return_inverse=True)
        first = _first_rows(inverse, rows)
    order = first.argsort()  # distinct rows numbered by their first row
    number = torch.empty_like(order)
    number[order] = torch.arange(len(order), device=order.device)
    return DistinctRows(first[order], number[inverse])


def _row_hashes(key: torch.Tensor) -> torch.Tensor:
    """(B,) a 64-bit hash of each row of `key` (B, T): a dot product with fixed odd multipliers."""
    weights = torch.randint(-(2**62), 2**62, (key.shape[1],), generator=torch.Generator().manual_seed(0)) | 1
    return (key.long() * weights.to(key.device)).sum(dim=1)  # int64 arithmetic wraps: mod 2**64


def _first_rows(inverse: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """(U,) the first row of each group of `inverse` (B,)."""
    first = torch.full((int(inverse.max()) + 1,), len(rows), dtype=rows.dtype, device=rows.device)
    return first.scatter_reduce(0, inverse, rows, reduce="amin")


def all_rows(num_rows: int, device: torch.device | str = "cpu") -> DistinctRows:
    """Every row its own distinct row: the grouping that turns deduplication off."""
    rows = torch.arange(num_rows, device=device)
    return DistinctRows(rows, rows)


def rows_to_compute(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, dedupe: bool, images: RowImages | None = None
) -> DistinctRows:
    """`distinct_rows` with `dedupe`, else `all_rows`: the rows a forward pass runs the model on."""
    if not dedupe:
        return all_rows(len(input_ids), input_ids.device)
    return distinct_rows(input_ids, attention_mask, images)


def batch_rows(batch: TensorDict, dedupe: bool) -> DistinctRows:
    """`rows_to_compute` of a batch's rows, with their images where they carry some: rows with
    equal ids share a forward only when their images are equal too (`row_images`)."""
    return rows_to_compute(batch["input_ids"], batch["attention_mask"], dedupe, row_images(batch))


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
    # apply out of place returns a TensorDict (tensordict's stub adds None, the in-place result)
    trimmed = cast(
        TensorDict,
        batch.exclude(*Batch.IMAGE_KEYS).apply(lambda x: x[:, :length] if x.dim() >= 2 and x.shape[1] == total else x),
    )
    return trimmed.update(batch.select(*(k for k in Batch.IMAGE_KEYS if k in batch.keys())))


def image_token_types(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """`mm_token_type_ids` of a (possibly wrapped) vision-language model: 1 on its image
    placeholders, 0 on text (B, T). With them the model gives images their multimodal rotary
    positions (M-RoPE), as the `hf` engine does (`strategies/hf/vl_generate.py`)."""
    inner: Any = getattr(model, "module", model)  # the model inside a DDP / DeepSpeed wrapper, or itself
    return input_ids.eq(inner.config.image_token_id).int()


def vision_token_ids_of(model: nn.Module) -> list[int]:
    """`vision_token_ids` of a (possibly wrapped) model's config; empty for a text-only model."""
    return vision_token_ids(getattr(getattr(model, "module", model), "config", None))


def pad_right(x: torch.Tensor, length: int) -> torch.Tensor:
    """Zero-pad (b, t) to (b, length) on the right: the inverse of `trim_padding` (a longer x, padded
    for dynamic batching, is cut to `length`)."""
    return F.pad(x, (0, length - x.shape[1]))


def iter_micro_batches(batch: TensorDict, micro_batch_size: int) -> Iterator[TensorDict]:
    """Consecutive row slices of at most `micro_batch_size` rows, each trimmed to its padding."""
    for start in range(0, batch.batch_size[0], micro_batch_size):
        yield trim_padding(batch[start : start + micro_batch_size])


def distinct_micro_batch_rows(
    rows: DistinctRows,
    micro_batch_size: int,
    attention_mask: torch.Tensor | None = None,
    budget: TokenBudget | None = None,
) -> Iterator[torch.Tensor]:
    """Row indices, in batch order, of each group of `micro_batch_size` distinct rows and every
    row sharing them (see `iter_distinct_micro_batches`). With a token `budget` (dynamic batching)
    the distinct rows are grouped by `bin_by_tokens` over their lengths in `attention_mask`
    (or by a sequence-packing plan's, `roll.distributed.sequence_packing.PackingBudget`) instead, and
    `micro_batch_size` is not used."""
    if budget is None:
        for start in range(0, len(rows.index), micro_batch_size):
            yield ((rows.inverse >= start) & (rows.inverse < start + micro_batch_size)).nonzero()[:, 0]
        return
    assert attention_mask is not None, "a token budget reads the rows' lengths in attention_mask"
    lengths = row_lengths(attention_mask[rows.index])
    for distinct in budget.bins(lengths):
        yield torch.isin(rows.inverse, torch.tensor(distinct, device=rows.inverse.device)).nonzero()[:, 0]


def micro_batch(batch: TensorDict, members: torch.Tensor, budget: TokenBudget | None = None) -> TensorDict:
    """Rows `members` of `batch`, trimmed to their padding, then (dynamic batching) padded to a
    multiple of the budget's `round_to`."""
    micro = trim_padding(batch[members])
    return micro if budget is None else pad_to_multiple(micro, budget.round_to)


def iter_distinct_micro_batches(
    batch: TensorDict, micro_batch_size: int, rows: DistinctRows, budget: TokenBudget | None = None
) -> Iterator[TensorDict]:
    """Micro-batches of at most `micro_batch_size` distinct rows each, holding every row sharing them.

    Gathering all rows of a distinct row into one micro-batch lets a single forward pass serve all
    of them in the whole mini-batch, not only those that happen to share a micro-batch. The model
    still sees at most `micro_batch_size` rows per pass; the other rows cost only their (rows, T)
    loss tensors. Rows keep their batch order within a micro-batch; each is trimmed to its padding.
    With `all_rows(B)` this is `iter_micro_batches`. With a token `budget`, micro-batches are
    `roll.distributed.dynamic_batching` bins of the distinct rows instead.
    """
    for members in distinct_micro_batch_rows(rows, micro_batch_size, batch["attention_mask"], budget):
        yield micro_batch(batch, members, budget)


def token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float,
    with_entropy: bool = False,
    dedupe: bool = True,
    images: RowImages | None = None,
    scored: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (B, T) and optionally entropies (B, T) of a causal LM, with grad.

    logprobs[:, t] = log p(input_ids[:, t] | input_ids[:, :t]) under logits / temperature, the
    distribution the token was sampled from; entropy[:, t] is that distribution's entropy. Both
    are computed for the tokens `scored` (B, T) marks (a response mask; None: every real token)
    and are 0 elsewhere: column 0, which has no predecessor, padding, and unscored tokens. The
    model's output head runs only at the positions predicting those tokens (`logits_at`), once per
    distinct row (module docstring); `dedupe=False` runs the model on every row, with the same
    results, to measure what that saves.

    `images` (a vision-language model: the rows' images, `row_images`) go to the model with the
    ids, each distinct row's own; rows share a forward only when their images are equal too, and
    the vision marker ids are left out of every distribution, as the engine leaves them out when
    sampling.
    """
    rows = rows_to_compute(input_ids, attention_mask, dedupe, images)
    shared = rows.index
    vision = vision_inputs(images.select(shared)) if images is not None else None
    if vision is not None:  # the model places image placeholders on their grids (M-RoPE) only when told where they are
        vision = vision | {"mm_token_type_ids": image_token_types(model, input_ids[shared])}
    inputs = {"input_ids": input_ids[shared], "attention_mask": attention_mask[shared], **(vision or {})}
    labels = input_ids[:, 1:]
    wanted = attention_mask[:, 1:].bool()  # label t + 1 is read from the logits at t
    if scored is not None:
        wanted = wanted & scored[:, 1:].bool()
    suppressed = vision_token_ids_of(model) if images is not None else []
    if suppressed:
        ids = torch.tensor(suppressed, device=input_ids.device)
        wanted = wanted & ~torch.isin(labels, ids)  # prompt placeholders: never sampled, scored 0
    row, col = wanted.nonzero().unbind(1)
    logits, slot = logits_at(model, inputs, rows.inverse[row], col)  # (K, V): no (U, T, V) logits
    logits = logits.float() / temperature
    if suppressed:  # the lowest finite logit, not -inf: 0 * -inf in an entropy is nan
        logits = logits.index_fill(-1, ids, torch.finfo(logits.dtype).min)
    log_normaliser = torch.cat([torch.logsumexp(chunk, dim=-1) for chunk in row_chunks(logits)])
    picked = logits[slot, labels[row, col]] - log_normaliser[slot]
    logprobs = _at_tokens(picked, row, col, input_ids.shape)
    if not with_entropy:
        return logprobs, None
    return logprobs, _at_tokens(entropy_from_logits(logits)[slot], row, col, input_ids.shape)


def _at_tokens(values: torch.Tensor, row: torch.Tensor, col: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """(B, T) zeros with values[i] at (row[i], col[i] + 1): a label's value goes to its own token.

    Rows sharing a representative read the same logits (`slot`); backward through the gather adds
    their gradients into the shared logits, the gradient of the whole batch."""
    return values.new_zeros(shape).index_put((row, col + 1), values)


def shifted_values(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, dedupe: bool = True
) -> torch.Tensor:
    """Values (B, T) of a value model (logits (B, T, 1)), aligned like `token_logprobs`.

    values[:, t] = V(input_ids[:, :t]): the value of the state in which token t was generated,
    i.e. the head's output at position t - 1. Column 0 and padding positions are 0.
    Once per distinct row, as `token_logprobs`: rows differing only in their last token share the
    state before it, so they share every value.
    """
    rows = rows_to_compute(input_ids, attention_mask, dedupe)
    shared = rows.index
    head = model(input_ids=input_ids[shared], attention_mask=attention_mask[shared]).logits[:, :-1, 0]
    return F.pad(rows.expand(head.float()) * attention_mask[:, 1:].to(torch.float32), (1, 0))


@torch.no_grad()
def forward_in_micro_batches(
    model: nn.Module,
    batch: TensorDict,
    forward: MicroForward,
    micro_batch_size: int,
    device: torch.device,
    dedupe: bool = True,
    budget: TokenBudget | None = None,
) -> dict[str, torch.Tensor]:
    """Run `forward(model, micro)` over micro-batches without grad; outputs (B, T) on CPU.

    With `dedupe`, micro-batches are those of `iter_distinct_micro_batches` over the whole batch,
    so a `forward` that deduplicates (see `MicroForward`) runs each distinct row of the batch once.
    Each micro-batch is trimmed to its longest row, so short rows do not pay for the longest one
    in the whole batch; outputs are zero-padded back to the batch's T and put back in batch order.
    A token `budget` (dynamic batching) forms the micro-batches by tokens instead of rows.
    """
    total = batch["input_ids"].shape[1]
    rows = batch_rows(batch, dedupe)
    order: list[torch.Tensor] = []
    parts: dict[str, list[torch.Tensor]] = {}
    for members in distinct_micro_batch_rows(rows, micro_batch_size, batch["attention_mask"], budget):
        order.append(members)
        for key, value in forward(model, micro_batch(batch, members, budget).to(device)).items():
            parts.setdefault(key, []).append(pad_right(value.float().cpu(), total))
    return {key: torch.cat(values)[torch.cat(order).argsort()] for key, values in parts.items()}
