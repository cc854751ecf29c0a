"""A causal LM's output head run only at the positions whose logits are used.

A scoring or training pass needs the logits at position t only where token t + 1 is scored: a
response token (`Batch.RESPONSE_MASK`). Prompt tokens, environment observations and padding are
never scored, yet an HF model maps every position's hidden state through its output head, a
(hidden x vocabulary) matmul, and a caller that scores in float32 copies all of it once more. With
a real vocabulary (Qwen2's 151,936 ids) those (rows, T, V) tensors are most of a pass's memory and
much of its time, while a step-wise row scores a handful of its positions.

`logits_at(model, inputs, rows, cols)` returns the (K, V) logits of the K distinct positions
(rows[i], cols[i]) of the model's input, in row-major order, and each pair's row among them. It
narrows the head's input with a forward pre-hook on the model's output embeddings
(`get_output_embeddings()`, found through DDP / DeepSpeed / peft wrappers), so the model is still
called whole: FSDP's and DeepSpeed's hooks, LoRA layers, vision towers and gradient checkpointing
run as always, and the head's matmul and everything after it (softcapping, the float32 copy,
log-softmax, entropy) see K positions. A model without such a head (Megatron's `MegatronCausalLM`)
returns all its logits and the same K rows are picked from them: the same numbers, without the
saving (logits at any other number of positions than its inputs' are an error, not misread).
`PackedSequences` (one packed row, no padding) is narrowed at the packed positions.

Backward through the narrowed input sends each picked position's gradient to its hidden state and
zero to the others, which is exactly the gradient of a loss that reads only those positions.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from roll.distributed.sequence_packing import PackedSequences

WRAPPER_DEPTH = 4
"""How many `.module` wrappers (DDP, DeepSpeed's engine) to look through for the output head."""


def output_head(model: nn.Module | PackedSequences) -> nn.Module | None:
    """The module mapping hidden states to logits (`get_output_embeddings()`), or None."""
    inner: object = model
    for _ in range(WRAPPER_DEPTH):
        get = getattr(inner, "get_output_embeddings", None)
        if callable(get):
            head = get()
            return head if isinstance(head, nn.Module) else None
        inner = getattr(inner, "module", None)
        if inner is None:
            return None
    return None


@contextmanager
def head_rows(model: nn.Module | PackedSequences, index: torch.Tensor, positions: int) -> Iterator[list[bool]]:
    """While open, the model's output head maps only rows `index` of its input's (positions, H)
    hidden states, given as (1, K, H). Yields a list that holds True once the head ran narrowed; it
    stays empty when the model has no head to narrow or its head saw another number of positions
    (then the model's logits are whole)."""
    head = output_head(model)
    narrowed: list[bool] = []
    if head is None:
        yield narrowed
        return

    def narrow(module: nn.Module, args: tuple) -> tuple | None:
        hidden = args[0]
        if narrowed or hidden.shape[:-1].numel() != positions:
            return None
        narrowed.append(True)
        return (hidden.reshape(positions, hidden.shape[-1]).index_select(0, index)[None], *args[1:])

    handle = head.register_forward_pre_hook(narrow)
    try:
        yield narrowed
    finally:
        handle.remove()


def logits_at(
    model: nn.Module | PackedSequences, inputs: dict, rows: torch.Tensor, cols: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits (K, V) at the distinct positions among (rows[i], cols[i]) of `inputs`'
    (U, T) ids, in row-major order, and (n,) which of the K each pair is (module docstring).

    With no pair at all, one position is still computed (row 0, column 0), so that a pass made to
    keep ranks in step still runs every layer and its backward reaches every parameter.
    """
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    wanted = torch.zeros(ids.shape, dtype=torch.bool, device=ids.device)
    wanted[rows, cols] = True
    if len(rows) == 0:
        wanted[0, 0] = True
    number = wanted.flatten().cumsum(0) - 1  # each wanted position's place among the K
    slot = number[rows * ids.shape[1] + cols]
    packed = model if isinstance(model, PackedSequences) else None
    if packed is not None:  # the head sees the real tokens only, row after row
        kept = packed.kept(mask)
        index, positions = wanted[kept].nonzero()[:, 0], int(kept.sum())
    else:  # the head sees all (U, T) positions
        index, positions = wanted.flatten().nonzero()[:, 0], ids.numel()
    with head_rows(model, index, positions) as narrowed:
        logits = packed.packed_logits(ids, kept) if packed is not None else model(**inputs, use_cache=False).logits
    logits = logits.reshape(-1, logits.shape[-1])
    if narrowed:
        return logits, slot
    if len(logits) != positions:  # picking by index would read other positions' logits
        raise ValueError(f"{type(model).__name__} returned logits at {len(logits)} positions for {positions} inputs")
    return logits.index_select(0, index), slot
