"""A tiny Qwen2.5-VL model with its processor (image processor, tokenizer, chat template), built
locally and saved as an ordinary HF dir.

Why: vision-language training runs on a CPU with no hub download. The model is a stock
`Qwen2_5_VLForConditionalGeneration` (random init, a 2-block vision tower and a 2-layer text model)
and the processor a stock `Qwen2_5_VLProcessor`, so the rest of roll loads it exactly as it loads
a real Qwen2.5-VL that a user names in `pretrain:` (`roll.models.loading.load_vl_model`,
`load_processor`).

The tokenizer is `roll.models.tiny`'s word-level one plus Qwen's vision markers
(`<|vision_start|>`, `<|image_pad|>`, `<|vision_end|>`, `<|video_pad|>`) as special tokens, and the
chat template is Qwen2.5-VL's in shape: a message's content is a string or a list of
`{"type": "image"}` / `{"type": "text", "text": ...}` parts, an image part printing
`<|vision_start|><|image_pad|><|vision_end|>` (the processor widens `<|image_pad|>` to one token
per merged patch). The image processor's `max_pixels` is small (a grid frame becomes 16 image
tokens by default), so a CPU step stays cheap.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import cast

import torch
from tokenizers import AddedToken
from transformers import (
    GenerationConfig,
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLProcessor,
)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from roll.models.tiny import build_tiny_tokenizer
from roll.utils.atomic import atomic_dir

log = logging.getLogger(__name__)

VISION_START, IMAGE_PAD, VISION_END, VIDEO_PAD = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"
VISION_TOKENS = (VISION_START, IMAGE_PAD, VISION_END, VIDEO_PAD)
PATCH_SIZE, MERGE_SIZE, TEMPORAL_PATCH_SIZE = 14, 2, 2
TINY_ROPE_THETA = 10.0
"""RoPE base of the tiny models: with head_dim 32, the width pairs turn 0.12-0.24 rad a cell (at
Qwen2.5-VL's 1e6, under 2e-4; see `vl_config`)."""
VL_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_vl_tokenizer(corpus: Iterable[str] = (), extra_tokens: Sequence[str] = ()) -> PreTrainedTokenizerFast:
    """`build_tiny_tokenizer` with Qwen's vision markers as special tokens and the VL chat template."""
    tokenizer = build_tiny_tokenizer(corpus, extra_tokens)
    tokenizer.add_special_tokens(
        {"additional_special_tokens": [AddedToken(t, special=True, normalized=False) for t in VISION_TOKENS]}
    )
    tokenizer.chat_template = VL_CHAT_TEMPLATE
    return tokenizer


def build_image_processor(max_pixels: int) -> Qwen2VLImageProcessorPil:
    """Qwen2-VL's image processor (pillow backend); images are resized to at most `max_pixels`."""
    unit = (PATCH_SIZE * MERGE_SIZE) ** 2
    return Qwen2VLImageProcessorPil(
        patch_size=PATCH_SIZE,
        merge_size=MERGE_SIZE,
        temporal_patch_size=TEMPORAL_PATCH_SIZE,
        size={"shortest_edge": min(unit, max_pixels), "longest_edge": max_pixels},
    )


def save_processor(directory: Path, tokenizer: PreTrainedTokenizerFast, max_pixels: int) -> None:
    """Write the files `AutoProcessor.from_pretrained` reads for a `Qwen2_5_VLProcessor`: the
    tokenizer (with the chat template), the image processor and `processor_config.json`. Saved
    part by part because transformers saves a Qwen-VL processor only with a video processor,
    which needs torchvision (see `roll.models.loading.image_only_processor_class`)."""
    tokenizer.save_pretrained(directory)
    build_image_processor(max_pixels).save_pretrained(directory)
    (directory / "processor_config.json").write_text(
        json.dumps({"processor_class": Qwen2_5_VLProcessor.__name__}, indent=2) + "\n"
    )


def vl_config(
    tokenizer: PreTrainedTokenizerFast,
    hidden_size: int,
    num_hidden_layers: int,
    num_attention_heads: int,
    intermediate_size: int,
    max_position_embeddings: int,
    vision_hidden_size: int,
    vision_depth: int,
    rope_theta: float = TINY_ROPE_THETA,
) -> Qwen2_5_VLConfig:
    """A Qwen2.5-VL config of the given sizes with `tokenizer`'s vocabulary and vision token ids.
    M-RoPE splits the text head's rotary half (head_dim / 2) over time, height and width as
    Qwen2.5-VL does (1/4, 3/8, 3/8), lowest frequencies last: width gets the slowest pairs.
    With a tiny head and Qwen's base of 1e6 those pairs turn by almost nothing from one cell to
    the next, so image tokens of a row would sit at nearly one position; `rope_theta`
    (`TINY_ROPE_THETA`) keeps every pair turning by a usable angle per cell."""
    mrope_section = _mrope_section(hidden_size // num_attention_heads)
    # One token in, one id out: the stub's return type (int | list[int]) covers lists of tokens too.
    ids = {
        name: cast(int, tokenizer.convert_tokens_to_ids(tok))
        for name, tok in zip(("start", "image", "end", "video"), VISION_TOKENS)
    }
    text_config = {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_attention_heads,
        "max_position_embeddings": max_position_embeddings,
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta, "mrope_section": mrope_section},
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": None,
    }
    vision_config = {
        "depth": vision_depth,
        "hidden_size": vision_hidden_size,
        "intermediate_size": 2 * vision_hidden_size,
        "num_heads": max(1, vision_hidden_size // 16),
        "out_hidden_size": hidden_size,
        "patch_size": PATCH_SIZE,
        "spatial_merge_size": MERGE_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
        "window_size": PATCH_SIZE * MERGE_SIZE * 4,
        "fullatt_block_indexes": [vision_depth - 1],
    }
    return Qwen2_5_VLConfig(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=ids["image"],
        video_token_id=ids["video"],
        vision_start_token_id=ids["start"],
        vision_end_token_id=ids["end"],
        tie_word_embeddings=True,
    )


def _mrope_section(head_dim: int) -> list[int]:
    """M-RoPE's split of the rotary half (head_dim / 2) over time, height and width: 1/4, 3/8, 3/8."""
    if head_dim % 8:
        raise ValueError(f"hidden_size / num_attention_heads must be a multiple of 8, got {head_dim}")
    half = head_dim // 2
    return [half // 4, 3 * half // 8, half - half // 4 - 3 * half // 8]


def build_tiny_vl_model(
    output_dir: str | os.PathLike[str],
    *,
    corpus: Iterable[str] = (),
    extra_tokens: Sequence[str] = (),
    hidden_size: int = 128,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    intermediate_size: int = 512,
    max_position_embeddings: int = 4096,
    vision_hidden_size: int = 64,
    vision_depth: int = 2,
    max_pixels: int = 112 * 112,
    seed: int = 0,
    overwrite: bool = False,
) -> str:
    """Build the processor (tokenizer from `corpus`) and a random Qwen2.5-VL model, save both into
    `output_dir`; return its absolute path. Idempotent like `roll.models.tiny.build_tiny_model`."""
    final = Path(output_dir).resolve()
    if (final / "config.json").is_file() and not overwrite:
        log.info("tiny VL model already exists at %s (overwrite=True rebuilds it)", final)
        return str(final)
    if final.is_dir() and any(final.iterdir()) and not overwrite:
        raise FileExistsError(f"{final} exists, is not empty and has no config.json; pass overwrite=True")
    tokenizer = build_vl_tokenizer(corpus, extra_tokens)
    tokenizer.model_max_length = max_position_embeddings
    config = vl_config(
        tokenizer,
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        vision_hidden_size=vision_hidden_size,
        vision_depth=vision_depth,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2_5_VLForConditionalGeneration._from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None
    )
    with atomic_dir(final) as tmp:
        model.save_pretrained(tmp)
        save_processor(tmp, tokenizer, max_pixels)
    num_params = sum(p.numel() for p in model.parameters())
    log.info("built tiny Qwen2.5-VL model (%d params, vocab %d) at %s", num_params, len(tokenizer), final)
    return str(final)
