"""Generation of the `hf` engine for vision-language models (a config with `vision_config`).

Batching: the requests of one `generate_batch` call run together, in groups of consecutive
requests bounded by `MAX_BATCH_PATCHES` image patches and `MAX_BATCH_TOKENS` padded prompt ids.
A group is one prefill over its rows left-padded, each row with its own images, then one decode
loop in which every row stops on its own. Each row samples with its own seed (`RowSampler`), so
its tokens do not depend on its batch-mates (up to float round-off). Where no row reuses a
session's KV, rows equal in ids and images are prefilled once.

Positions are the model's multimodal rotary positions (M-RoPE, the model's `get_rope_index`),
computed per row over that row's real ids alone and passed to the model explicitly, so padding
and batch-mates change nothing; a generated id takes the position after the largest one before
it. The trainer scores with the same positions (`micro_batches.token_logprobs`).

KV reuse across turns: a request with a `session_id` reuses the session's cached KV
(`kv_cache.py`) for the longest common prefix of ids, cut back to the first placeholder of the
first image that is not the very image the session saw there (`image_keys`) or that the prefix
covers only in part. The KV before that cut depends on no later id or image, so the answer equals
a fresh prefill's (up to round-off); the new ids are fed with only the images after the cut.

Vision marker ids (`suppressed_token_ids`) are never sampled, and log-probs are of the
distribution without them, as the trainer computes them. The page: docs/vision_language.md.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from transformers import DynamicCache

from roll.core.records import GenerateOutput, GenerateRequest, ImageInputs
from roll.distributed.strategies.hf.device_sampling import RowSampler, suppress
from roll.distributed.strategies.hf.kv_cache import Prefix, SessionKVCache, cache_kv, row_chunk
from roll.distributed.strategies.hf.prefill import Prefill, build_prefill, left_pad

if TYPE_CHECKING:
    from transformers import PreTrainedModel

MAX_BATCH_PATCHES = 16_384  # image patches one prefill encodes (the vision tower's activations)
MAX_BATCH_TOKENS = 65_536  # rows x padded prompt width of one prefill (the text model's activations)


class Engine(Protocol):
    """What this module uses of the engine (`infer.HFInferStrategy`)."""

    model: PreTrainedModel
    kv_cache: SessionKVCache
    stats: dict[str, int]
    pad_token_id: int
    eos_token_ids: list[int]
    suppressed_token_ids: list[int]
    policy_version: int

    def pace(self) -> None: ...


def image_keys(images: ImageInputs | None) -> tuple[str, ...]:
    """One key per image: a hash (SHA-1) of its grid and its rows of `pixel_values`."""
    if images is None:
        return ()
    pixels = torch.as_tensor(images.pixel_values).detach().cpu().contiguous()
    keys, start = [], 0
    for grid in images.image_grid_thw:
        size = grid[0] * grid[1] * grid[2]
        digest = hashlib.sha1(repr(list(grid)).encode(), usedforsecurity=False)
        # the buffer, not a copy (numpy's stubs give ndarray no __buffer__ before Python 3.12)
        digest.update(pixels[start : start + size].view(torch.uint8).numpy())  # type: ignore[arg-type]
        keys.append(digest.hexdigest())
        start += size
    return tuple(keys)


def image_spans(prompt_ids: list[int], images: ImageInputs | None, image_token_id: int, merge: int) -> list[range]:
    """Each image's placeholder positions in the prompt, in image order."""
    if images is None:
        return []
    where = [i for i, t in enumerate(prompt_ids) if t == image_token_id]
    spans, used = [], 0
    for t, h, w in images.image_grid_thw:
        n = t * h * w // merge**2
        if used + n > len(where):
            raise ValueError(f"the prompt holds {len(where)} image placeholders, fewer than its images need")
        spans.append(range(where[used], where[used + n - 1] + 1))
        used += n
    return spans


@dataclass
class VLRow:
    """One request of a group: the KV it reuses and the images it feeds (from `first_image` on)."""

    request: GenerateRequest
    prefix: Prefix
    keys: tuple[str, ...]
    first_image: int

    def new_images(self) -> tuple[torch.Tensor, list[list[int]]] | None:
        """(pixel rows, grids) of the images after the reused prefix; None if there are none."""
        images = self.request.images
        if images is None or self.first_image >= images.num_images:
            return None
        grids = images.image_grid_thw
        skip = sum(t * h * w for t, h, w in grids[: self.first_image])
        return images.pixel_values[skip:], [list(g) for g in grids[self.first_image :]]


def plan_row(engine: Engine, request: GenerateRequest) -> VLRow:
    """The session prefix a request may reuse, cut before the first image it must not reuse."""
    if request.session_id is None or not engine.kv_cache.enabled:
        return VLRow(request, Prefix(), (), 0)  # nothing to reuse or store: no image to hash
    keys = image_keys(request.images)
    prefix = engine.kv_cache.match(request.session_id, request.prompt_ids)
    config = engine.model.config
    spans = image_spans(request.prompt_ids, request.images, config.image_token_id, _merge_size(config))
    for k, span in enumerate(spans):
        if span.start >= prefix.length:
            return VLRow(request, prefix, keys, k)
        if span.stop > prefix.length or k >= len(prefix.images) or prefix.images[k] != keys[k]:
            return VLRow(request, prefix.leading(span.start), keys, k)
    return VLRow(request, prefix, keys, len(spans))


def batch_groups(
    requests: list[GenerateRequest], max_patches: int = MAX_BATCH_PATCHES, max_tokens: int = MAX_BATCH_TOKENS
) -> list[list[int]]:
    """Consecutive request indices, each group within both bounds (a request over them runs alone)."""
    groups: list[list[int]] = []
    patches, width = 0, 0
    for i, r in enumerate(requests):
        p = 0 if r.images is None else sum(t * h * w for t, h, w in r.images.image_grid_thw)
        w = max(width, len(r.prompt_ids))
        if not groups or patches + p > max_patches or (len(groups[-1]) + 1) * w > max_tokens:
            groups.append([])
            patches, w = 0, len(r.prompt_ids)
        groups[-1].append(i)
        patches, width = patches + p, w
    return groups


@torch.no_grad()
def generate_with_images(engine: Engine, requests: list[GenerateRequest]) -> list[GenerateOutput]:
    """Every request's answer, in order; each group of `batch_groups` is one prefill and decode."""
    answers: dict[int, GenerateOutput] = {}
    for group in batch_groups(requests, MAX_BATCH_PATCHES, MAX_BATCH_TOKENS):
        for i, out in zip(group, _generate_group(engine, [plan_row(engine, requests[i]) for i in group])):
            answers[i] = out
    return [answers[i] for i in range(len(requests))]


def rope_positions(
    model: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor, grids: torch.Tensor | None
) -> torch.Tensor:
    """M-RoPE positions (3, B, L) of left- or right-padded rows `ids` (B, L) with real ids where
    `mask` is 1 and images `grids` (K, 3) in row order; padding gets 0."""
    if grids is None:
        return (mask.cumsum(-1) - 1).clamp(min=0).unsqueeze(0).expand(3, -1, -1)
    types = ids.eq(model.config.image_token_id).int()  # text 0, image 1
    positions, _ = model.model.get_rope_index(
        input_ids=ids, mm_token_type_ids=types, image_grid_thw=grids, attention_mask=mask
    )
    return positions


def _prefill(engine: Engine, rows: list[VLRow], device: torch.device) -> tuple[Prefill, torch.Tensor, torch.Tensor]:
    """The group's first model call, over distinct rows only when no row reuses a session's KV:
    the members of a group start from the same prompt and frame, so rows equal in ids and images
    are computed once and their logits and KV copied to every row that asked (each still samples
    with its own seed). Returns (prefill, last-position logits (B, V), each row's next position (B,))."""
    if any(row.prefix.length for row in rows):
        return _run_prefill(engine, rows, device)
    firsts, inverse = distinct_rows(rows)
    engine.stats["prefill_rows_computed"] += len(firsts)
    if len(firsts) == len(rows):
        return _run_prefill(engine, rows, device)
    prefill, logits, next_position = _run_prefill(engine, [rows[i] for i in firsts], device)
    index = torch.tensor(inverse, device=device)
    layers = [(keys.index_select(0, index), values.index_select(0, index)) for keys, values in cache_kv(prefill.cache)]
    expanded = Prefill(
        prefill.input_ids[index],
        prefill.attention_mask[index],
        prefill.position_ids[index],
        DynamicCache(layers),
        [prefill.new[k] for k in inverse],
    )
    engine.stats["prefill_tokens"] += sum(expanded.new) - sum(prefill.new)  # counted per row asked, as for text
    return expanded, logits[index], next_position[index]


def distinct_rows(rows: list[VLRow]) -> tuple[list[int], list[int]]:
    """(index of each distinct row's first occurrence, each row's distinct-row number): rows are
    equal when their prompt ids and images (pixels and grids) are."""
    firsts: list[int] = []
    inverse: list[int] = []
    by_ids: dict[tuple[int, ...], list[int]] = {}
    for i, row in enumerate(rows):
        candidates = by_ids.setdefault(tuple(row.request.prompt_ids), [])
        same = next((u for u in candidates if _same_images(rows[firsts[u]].request.images, row.request.images)), None)
        if same is None:
            same = len(firsts)
            firsts.append(i)
            candidates.append(same)
        inverse.append(same)
    return firsts, inverse


def _same_images(a: ImageInputs | None, b: ImageInputs | None) -> bool:
    if a is None or b is None:
        return a is b
    return list(map(list, a.image_grid_thw)) == list(map(list, b.image_grid_thw)) and torch.equal(
        torch.as_tensor(a.pixel_values), torch.as_tensor(b.pixel_values)
    )


def _run_prefill(engine: Engine, rows: list[VLRow], device: torch.device) -> tuple[Prefill, torch.Tensor, torch.Tensor]:
    """Build and run one prefill over `rows`: (prefill, last-position logits (B, V), each row's
    next position (B,))."""
    requests = [row.request for row in rows]
    prefill = build_prefill(requests, [row.prefix for row in rows], engine.pad_token_id, device)
    full_ids, full_mask = left_pad([r.prompt_ids for r in requests], engine.pad_token_id)
    all_grids = [g for r in requests if r.images is not None for g in r.images.image_grid_thw]
    grids = torch.tensor(all_grids, dtype=torch.long, device=device) if all_grids else None
    positions = rope_positions(engine.model, full_ids.to(device), full_mask.to(device), grids)
    new = [images for images in (row.new_images() for row in rows) if images is not None]
    vision = {}
    if new:
        vision = {
            "pixel_values": torch.cat([p for p, _ in new]).to(device, engine.model.dtype),
            "image_grid_thw": torch.tensor([g for _, gs in new for g in gs], dtype=torch.long, device=device),
        }
    engine.stats["prefill_calls"] += 1
    engine.stats["prefill_tokens"] += sum(prefill.new)
    engine.stats["prefix_tokens_reused"] += sum(row.prefix.length for row in rows)
    logits = engine.model(
        input_ids=prefill.input_ids,
        attention_mask=prefill.attention_mask,
        position_ids=positions[:, :, -prefill.input_ids.shape[1] :],
        past_key_values=prefill.cache,
        use_cache=True,
        logits_to_keep=1,  # rows are left-padded: the last position is every row's last id
        **vision,
    ).logits[:, -1, :]
    return prefill, logits, positions.amax(dim=(0, 2)) + 1


def _generate_group(engine: Engine, rows: list[VLRow]) -> list[GenerateOutput]:
    """One prefill, then one token a step for every row until each has stopped."""
    device = next(engine.model.parameters()).device
    requests = [row.request for row in rows]
    n = len(rows)
    sampler = RowSampler(requests, device, engine.model.config.get_text_config().vocab_size)
    stop_sets = [r.params.stop_ids(engine.eos_token_ids) for r in requests]
    max_new = [r.params.max_new_tokens for r in requests]
    out_ids: list[list[int]] = [[] for _ in range(n)]
    out_lps: list[list[float]] = [[] for _ in range(n)]
    finish = ["length"] * n
    active = [m > 0 for m in max_new]
    if not any(active):
        return _outputs(engine, requests, out_ids, out_lps, finish)
    prefill, logits, next_position = _prefill(engine, rows, device)
    attention_mask = prefill.attention_mask
    while True:
        tokens, logprobs = sampler.sample(suppress(logits.float(), engine.suppressed_token_ids))
        row_tokens, row_logprobs = tokens.tolist(), logprobs.tolist()  # one device sync a step
        for i in range(n):
            if not active[i]:
                continue
            out_ids[i].append(row_tokens[i])
            out_lps[i].append(row_logprobs[i])
            if row_tokens[i] in stop_sets[i]:
                active[i], finish[i] = False, "stop"
            elif len(out_ids[i]) >= max_new[i]:
                active[i] = False
        if not any(active):
            break
        engine.stats["decode_steps"] += 1
        engine.pace()
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(n, 1)], dim=1)
        logits = engine.model(
            input_ids=tokens.view(n, 1),
            attention_mask=attention_mask,
            position_ids=next_position.view(1, n, 1).expand(3, n, 1),
            past_key_values=prefill.cache,
            use_cache=True,
        ).logits[:, -1, :]
        next_position = next_position + 1
    _store_sessions(engine, rows, prefill, out_ids)
    return _outputs(engine, requests, out_ids, out_lps, finish)


def _outputs(
    engine: Engine,
    requests: list[GenerateRequest],
    out_ids: list[list[int]],
    out_lps: list[list[float]],
    finish: list[str],
) -> list[GenerateOutput]:
    return [
        GenerateOutput(r.request_id, out_ids[i], out_lps[i], finish[i], engine.policy_version)
        for i, r in enumerate(requests)
    ]


def _store_sessions(engine: Engine, rows: list[VLRow], prefill: Prefill, out_ids: list[list[int]]) -> None:
    """Keep each session's KV for the ids it fed (prompt + generated ids but the last) and the keys
    of its prompt's images; row i fed its new ids at [P + N - m_i, P + N) and its generated ids
    right after them."""
    if not engine.kv_cache.enabled:
        return
    end_of_prompt = prefill.attention_mask.shape[1]  # P + N
    layers = cache_kv(prefill.cache)
    for i, row in enumerate(rows):
        r = row.request
        if r.session_id is None or not out_ids[i]:
            continue
        fed = slice(end_of_prompt - prefill.new[i], end_of_prompt + len(out_ids[i]) - 1)
        chunks = row.prefix.chunks + [row_chunk(layers, i, fed)]
        engine.kv_cache.store(r.session_id, r.prompt_ids + out_ids[i][:-1], chunks, row.keys)


def _merge_size(config) -> int:
    return getattr(config.vision_config, "spatial_merge_size", 2)
