"""A tiny causal LM and its word-level tokenizer, built locally and saved as an ordinary HF dir.

Why: the FrozenLake example trains from random init on a CPU, with no hub download. The model is a
stock `LlamaForCausalLM` / `Qwen2ForCausalLM` (about 0.5M parameters with the defaults) and the
tokenizer a `tokenizers` WordLevel model, so the rest of roll loads it with `from_pretrained` of a
local dir, exactly as it loads a real model that a user names in `pretrain:`.

The vocabulary is small on purpose (under 100 tokens for FrozenLake): every grid symbol and action
word is one token, so a few hundred RL steps are enough for a random model to learn the task.

    python -m roll.models.tiny --output_dir ./tiny_lm --preset frozen_lake
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
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

from roll.agentic.env.registry import make_env

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
# Preset name -> (env_type, env_config) whose texts make up the tokenizer corpus.
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "frozen_lake": ("frozen_lake", {}),
    "sokoban": ("sokoban", {"dim_room": [6, 6], "num_boxes": 1, "search_depth": 10}),
    "webshop": ("webshop", {}),
    # the math agent example's dataset rows, its tool prompt and the tool-call markup
    "math": ("agent", {"dataset": str(Path(__file__).resolve().parents[2] / "examples" / "math_agent" / "data"
                                      / "train_agent.jsonl")}),
}


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


def build_tiny_tokenizer(
    corpus: Iterable[str] = (), extra_tokens: Sequence[str] = ()
) -> PreTrainedTokenizerFast:
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
    backend.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        unk_token=UNK,
        eos_token=IM_END,
        bos_token=None,
        chat_template=CHAT_TEMPLATE,
    )


def collect_env_text(env: Any, num_seeds: int = 20) -> list[str]:
    """The texts a tokenizer must cover for `env` (a `TextEnv`): its action words, and for seeds
    0..num_seeds-1 the instruction, the first observation and the observations after playing each
    action once in turn (until the episode ends), so feedback words are in the vocabulary too.

    An env whose actions are open text (WebShop's `search[...]`) provides `tokenizer_corpus()`
    instead, which is used as is."""
    if callable(getattr(env, "tokenizer_corpus", None)):
        texts = list(env.tokenizer_corpus())
        env.close()
        return texts
    texts = list(env.actions)
    for seed in range(num_seeds):
        obs, info = env.reset(seed=seed)
        texts += [info["env_instruction"], obs]
        for action in env.actions:
            obs, _, terminated, truncated, _ = env.step(f"{ANSWER_TAGS[0]}{action}{ANSWER_TAGS[1]}")
            texts.append(obs)
            if terminated or truncated:
                break
    env.close()
    return texts


def env_corpus(env_type: str, env_config: Mapping[str, Any], num_seeds: int = 20) -> list[str]:
    """`collect_env_text` of a registered env (`env_type` as in `custom_envs.<Tag>.env_type`)."""
    return collect_env_text(make_env(env_type, dict(env_config)), num_seeds)


def corpus_and_tokens(env_type: str, env_config: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """The corpus and the extra whole tokens for `env_type`: an agent dataset (env_type "agent")
    brings its rows' text and its tools' markup (`agent_corpus`), an env only its text."""
    if env_type == "agent":
        from roll.agentic.agent_loop.dataset import agent_corpus

        return agent_corpus(env_config)
    return env_corpus(env_type, env_config), []


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


@contextlib.contextmanager
def _atomic_dir(final: Path) -> Iterator[Path]:
    """Yield a temporary sibling of `final` to fill; on success swap it in for `final`.

    A build killed half-way leaves only a hidden `.NAME.*.tmp` sibling, never a `final` dir that
    looks complete (has config.json) but lacks weights or tokenizer files.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        yield tmp
        if final.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".old", dir=final.parent))
            final.rename(old / final.name)
            tmp.rename(final)
            shutil.rmtree(old)
        else:
            tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already after a successful rename


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
            f"{final} exists, is not empty and has no config.json; "
            "choose another output_dir or pass overwrite=True"
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
    with _atomic_dir(final) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    num_params = sum(p.numel() for p in model.parameters())
    log.info(
        "built tiny %s model (%d params, vocab %d) at %s", arch, num_params, len(tokenizer), final
    )
    return str(final)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m roll.models.tiny", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--output_dir", required=True)
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--preset", choices=sorted(PRESETS), help="take the corpus from a built-in env"
    )
    source.add_argument(
        "--env_type", help="take the corpus from this env (id, alias or module:Class)"
    )
    parser.add_argument(
        "--env_config", type=json.loads, default={}, help="JSON kwargs for --env_type"
    )
    parser.add_argument("--arch", choices=sorted(ARCH_CONFIGS), default="llama")
    for name, default in (
        ("hidden_size", 128),
        ("num_hidden_layers", 2),
        ("num_attention_heads", 4),
        ("intermediate_size", 512),
        ("max_position_embeddings", 2048),
        ("seed", 0),
    ):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument(
        "--tie_word_embeddings", action=argparse.BooleanOptionalAction, default=True
    )
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    if args.env_config and not args.env_type:
        parser.error("--env_config needs --env_type")
    return args


def main(argv: Sequence[str] | None = None) -> str:
    args = _parse_args(argv)
    env_type, env_config = PRESETS[args.preset] if args.preset else (args.env_type, args.env_config)
    try:
        corpus, extra_tokens = corpus_and_tokens(env_type, env_config) if env_type else ([], [])
    except (ValueError, TypeError, OSError) as err:  # unknown env_type or env_config keys: one line
        sys.exit(f"python -m roll.models.tiny: {err}")
    path = build_tiny_model(
        args.output_dir,
        corpus=corpus,
        extra_tokens=extra_tokens,
        arch=args.arch,
        hidden_size=args.hidden_size,
        num_hidden_layers=args.num_hidden_layers,
        num_attention_heads=args.num_attention_heads,
        intermediate_size=args.intermediate_size,
        max_position_embeddings=args.max_position_embeddings,
        tie_word_embeddings=args.tie_word_embeddings,
        seed=args.seed,
        overwrite=args.overwrite,
    )
    print(path)
    return path


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    main()
