"""A tiny causal LM and its word-level tokenizer, built locally and saved as an ordinary HF dir.

Why: the FrozenLake example trains from random init on a CPU, with no hub download. The model is a
stock `LlamaForCausalLM` / `Qwen2ForCausalLM` (about 0.5M parameters with the defaults) and the
tokenizer a `tokenizers` WordLevel model, so the rest of roll loads it with `from_pretrained` of a
local dir, exactly as it loads a real model that a user names in `pretrain:`.

The vocabulary is small on purpose (under 100 tokens for FrozenLake): every grid symbol and action
word is one token, so a few hundred RL steps are enough for a random model to learn the task.

The corpus comes in as plain texts and words (`build_tiny_model(corpus=..., extra_tokens=...)`);
taking it from an env or an agent dataset, and the command line, are the job of a builder above
both models and envs:

    python -m roll.pipeline.tiny_model --output_dir ./tiny_lm --preset frozen_lake
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    LlamaConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

from roll.utils.atomic import atomic_dir

log = logging.getLogger(__name__)

PAD, UNK, IM_START, IM_END = "<pad>", "<unk>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (PAD, UNK, IM_START, IM_END)
# Added but not special: `decode(..., skip_special_tokens=True)` keeps them for the env's parser.
ANSWER_TAGS = ("<answer>", "</answer>")
ROLE_WORDS = ("system", "user", "assistant")
ACTION_WORDS = ("Left", "Down", "Right", "Up")
GRID_SYMBOLS = ("P", "_", "O", "G", "X", "√", "#", ".")
DIGITS = tuple("0123456789")
PUNCTUATION = tuple(",.:;!?'\"()[]{}<>-+=*/|%&@$")
# A newline, a capitalised word ("Left", "You"), a lowercase word, else one non-space character
# (so the grid row "P_OG" is four tokens). Other whitespace separates pieces and is dropped.
PIECE_PATTERN = r"\n|[A-Z][a-z]+|[a-z]+|\S"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
ARCH_CONFIGS = {"llama": LlamaConfig, "qwen2": Qwen2Config}


def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"[^\S\n]+"), behavior="removed"),
            pre_tokenizers.Split(Regex(PIECE_PATTERN), behavior="isolated"),
        ]
    )


def _decoder() -> decoders.Decoder:
    """Join tokens with single spaces, but none around newlines: "P _ O G\\n_ _ G _".

    Word-level pieces do not remember whether a space separated them, so this is readable text,
    not the exact input; the env's answer parser strips spaces inside `<answer> Left </answer>`.
    """
    return decoders.Sequence(
        [
            decoders.Replace(Regex("^"), " "),
            decoders.Fuse(),
            decoders.Replace(Regex(" ?\n ?"), "\n"),
            decoders.Strip(" ", 1, 0),
        ]
    )


def _corpus_words(corpus: Iterable[str], whole_tokens: Sequence[str]) -> set[str]:
    """Every pre-tokenized piece of `corpus`, with the whole (added) tokens cut out first."""
    splitter = _pre_tokenizer()
    words: set[str] = set()
    for text in corpus:
        for token in whole_tokens:
            text = text.replace(token, " ")
        words.update(piece for piece, _ in splitter.pre_tokenize_str(text))
    return words


def build_tiny_tokenizer(corpus: Iterable[str] = (), extra_tokens: Sequence[str] = ()) -> PreTrainedTokenizerFast:
    """A word-level tokenizer: the fixed base vocabulary, then `extra_tokens`, then the words of
    `corpus` (sorted), so ids are deterministic and the base ids never move.

    `extra_tokens` are matched as whole strings anywhere in the text before splitting (like
    `<answer>`); words outside the vocabulary encode as `<unk>`.
    """
    added = list(dict.fromkeys([*ANSWER_TAGS, *extra_tokens]))
    base = [
        *SPECIAL_TOKENS,
        *ANSWER_TAGS,
        "\n",
        *ROLE_WORDS,
        *ACTION_WORDS,
        *GRID_SYMBOLS,
        *DIGITS,
        *PUNCTUATION,
    ]
    vocab = list(dict.fromkeys([*base, *extra_tokens]))
    known = set(vocab)
    vocab += sorted(_corpus_words(corpus, [*SPECIAL_TOKENS, *added]) - known)

    backend = Tokenizer(models.WordLevel({tok: i for i, tok in enumerate(vocab)}, unk_token=UNK))
    backend.pre_tokenizer = _pre_tokenizer()
    backend.decoder = _decoder()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        unk_token=UNK,
        eos_token=IM_END,
        bos_token=None,
        chat_template=CHAT_TEMPLATE,
    )


def _model_config(tokenizer: PreTrainedTokenizerFast, arch: str, **sizes: Any) -> Any:
    """A Llama/Qwen2 config sized by `sizes`, with the tokenizer's vocabulary and special ids."""
    if arch not in ARCH_CONFIGS:
        raise ValueError(f"arch {arch!r} is not one of {sorted(ARCH_CONFIGS)}")
    return ARCH_CONFIGS[arch](
        vocab_size=len(tokenizer),
        num_key_value_heads=sizes["num_attention_heads"],
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        **sizes,
    )


def _init_model(config: Any, seed: int) -> Any:
    """Random float32 weights that depend on `seed` alone (the global RNG is left untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, bos_token_id=None
    )
    return model


def build_tiny_model(
    output_dir: str | os.PathLike[str],
    *,
    corpus: Iterable[str] = (),
    extra_tokens: Sequence[str] = (),
    arch: Literal["llama", "qwen2"] = "llama",
    hidden_size: int = 128,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    intermediate_size: int = 512,
    max_position_embeddings: int = 2048,
    tie_word_embeddings: bool = True,
    seed: int = 0,
    overwrite: bool = False,
) -> str:
    """Build the tokenizer (from `corpus`) and a randomly initialised model, save both (with the
    chat template and generation config) into `output_dir`; return its absolute path.

    Idempotent: a dir that already has config.json is returned unchanged unless `overwrite`.
    """
    final = Path(output_dir).resolve()
    if (final / "config.json").is_file() and not overwrite:
        log.info("tiny model already exists at %s (overwrite=True rebuilds it)", final)
        return str(final)
    if final.is_dir() and any(final.iterdir()) and not overwrite:
        raise FileExistsError(
            f"{final} exists, is not empty and has no config.json; choose another output_dir or pass overwrite=True"
        )
    tokenizer = build_tiny_tokenizer(corpus, extra_tokens)
    tokenizer.model_max_length = max_position_embeddings
    config = _model_config(
        tokenizer,
        arch,
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
    )
    model = _init_model(config, seed)
    with atomic_dir(final) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    num_params = sum(p.numel() for p in model.parameters())
    log.info("built tiny %s model (%d params, vocab %d) at %s", arch, num_params, len(tokenizer), final)
    return str(final)


if __name__ == "__main__":
    sys.exit(
        "python -m roll.models.tiny moved: run python -m roll.pipeline.tiny_model (same arguments); "
        "it takes the corpus from an env or an agent dataset"
    )
