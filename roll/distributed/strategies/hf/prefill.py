"""The prefill of a batch of the `hf` engine: each row laid out as [pad | reused KV | pad | new ids].

`build_prefill(requests, prefixes, pad_id, device)` left-pads each request's new ids (those after
the session prefix it reuses) to one width N and its reused keys and values (`kv_cache.Prefix`) to
one width P, with an attention mask that is 1 on every real id and position ids that count each
row's real ids, so one model call gives every row the logits of a forward over that row alone.
Used by the dynamic-cache loop (`hf_infer`) and the static decode slots (`slot_serving`) alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache

from roll.core.padding import length_mask, padded
from roll.core.records import GenerateRequest
from roll.distributed.strategies.hf.kv_cache import Prefix, left_padded_past


@dataclass
class Prefill:
    """The first model call of a batch. Row i is [pad | n_i reused | pad | m_i new ids]: the reused
    KV left-padded to width P in `cache`, the new ids left-padded to width N in `input_ids`."""

    input_ids: torch.Tensor  # (B, N)
    attention_mask: torch.Tensor  # (B, P + N), 1 on real ids (reused or new)
    position_ids: torch.Tensor  # (B, N), index among the row's real ids
    cache: DynamicCache  # P positions per layer
    new: list[int]  # m_i


def build_prefill(
    requests: list[GenerateRequest], prefixes: list[Prefix], pad_id: int, device: torch.device
) -> Prefill:
    new_ids = [r.prompt_ids[p.length :] for r, p in zip(requests, prefixes)]
    input_ids, new_mask = left_pad(new_ids, pad_id)
    width = max(p.length for p in prefixes)
    past_mask = torch.from_numpy(length_mask([p.length for p in prefixes], width, left=True).astype(np.int64))
    attention_mask = torch.cat([past_mask, new_mask], dim=1).to(device)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, width:]
    cache = DynamicCache(left_padded_past(prefixes)) if width else DynamicCache()
    return Prefill(input_ids.to(device), attention_mask, position_ids, cache, [len(s) for s in new_ids])


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask), both (B, max length): each row's ids at its end, pad_id before them."""
    width = max(len(s) for s in seqs)
    ids = padded(seqs, width, pad_id, np.int64, left=True)
    mask = length_mask([len(s) for s in seqs], width, left=True).astype(np.int64)
    return torch.from_numpy(ids), torch.from_numpy(mask)
