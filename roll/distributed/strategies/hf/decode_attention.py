"""`roll_sdpa`: transformers' sdpa attention, with single-token queries against a grouped-query
(GQA) cache computed without repeating the keys and values per query head.

transformers' sdpa path repeats every key/value head for each of its query heads (`repeat_kv`)
whenever a mask is given, which a left-padded decode batch always has: with Qwen2-0.5B's 14 query
heads over 2 key/value heads, each decode step then writes and reads 7 copies of the whole KV cache.
Here a decode step lays the query heads of each key/value head along the query axis, (B, H, 1, D)
-> (B, H_kv, H / H_kv, D), so `scaled_dot_product_attention` reads each cached key and value once;
the mask (B, 1, 1, L) broadcasts over both head axes. Everything else (prefill, training, masks of
another shape) goes to transformers' own sdpa function unchanged.

`use_on(model)` registers the function and its mask builder (sdpa's) under "roll_sdpa" and
switches a model whose attention is "sdpa" to it; the outputs are those of sdpa up to round-off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

if TYPE_CHECKING:
    from transformers import PreTrainedModel

NAME = "roll_sdpa"


def roll_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    groups = getattr(module, "num_key_value_groups", 1)
    packed = (
        query.shape[2] == 1
        and groups > 1
        and attention_mask is not None
        and attention_mask.dim() == 4
        and attention_mask.shape[1] == 1
        and not kwargs.get("output_attentions")
    )
    if not packed:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    batch, heads, _, dim = query.shape
    q = query.reshape(batch, heads // groups, groups, dim)  # query head h reads key/value head h // groups
    mask = attention_mask[:, :, :, : key.shape[-2]]
    out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, dropout_p=0.0, scale=scaling)
    return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None


def use_on(model: PreTrainedModel) -> bool:
    """Switch `model` from "sdpa" to "roll_sdpa"; False (and nothing changed) for any other attention."""
    if model.config._attn_implementation != "sdpa":
        return False
    AttentionInterface.register(NAME, roll_sdpa)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.config._attn_implementation = NAME
    return True
