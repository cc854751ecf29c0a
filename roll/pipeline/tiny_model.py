"""Build the tiny model (`roll.models.tiny`) with a corpus taken from an env or an agent dataset.

This sits above both `roll.models` and `roll.agentic`: it plays an env (or reads a dataset) to
collect the texts the tokenizer must cover, and hands them to `build_tiny_model` as plain
arguments.

    python -m roll.pipeline.tiny_model --output_dir ./tiny_lm --preset frozen_lake
    python -m roll.pipeline.tiny_model --output_dir ./tiny_vl --preset vl_sokoban

A `vl_*` preset builds a tiny Qwen2.5-VL (`roll.models.tiny_vl`) with its processor instead.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from roll.agentic.env.registry import make_env
from roll.models.tiny import ANSWER_TAGS, ARCH_CONFIGS, build_tiny_model
from roll.models.tiny_vl import build_tiny_vl_model

# Preset name -> (env_type, env_config) whose texts make up the tokenizer corpus.
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "frozen_lake": ("frozen_lake", {}),
    "sokoban": ("sokoban", {"dim_room": [6, 6], "num_boxes": 1, "search_depth": 10}),
    "webshop": ("webshop", {}),
    # the math agent example's dataset rows, its tool prompt and the tool-call markup
    "math": (
        "agent",
        {
            "dataset": str(
                Path(__file__).resolve().parents[2] / "examples" / "math_agent" / "data" / "train_agent.jsonl"
            )
        },
    ),
}
# Vision-language presets: a tiny Qwen2.5-VL whose tokenizer covers the same env's text.
VL_PRESETS = {"vl_sokoban": "sokoban", "vl_frozen_lake": "frozen_lake"}


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


def env_corpus_and_tokens(env_type: str, env_config: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """`env_corpus`, and the strings the env wants as whole tokens (`tokenizer_whole_words()`,
    e.g. WebShop's product codes, which the model must copy from a page in one piece)."""
    env = make_env(env_type, dict(env_config))
    hook = getattr(env, "tokenizer_whole_words", None)
    whole = list(hook()) if callable(hook) else []
    return collect_env_text(env), whole


def corpus_and_tokens(env_type: str, env_config: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """The corpus and the extra whole tokens for `env_type`: an agent dataset (env_type "agent")
    brings its rows' text and its tools' markup (`agent_corpus`), an env its text and its
    `tokenizer_whole_words()` if it has that hook."""
    if env_type == "agent":
        from roll.agentic.agent_loop.dataset import agent_corpus  # the agent stack, only when asked for

        return agent_corpus(env_config)
    return env_corpus_and_tokens(env_type, env_config)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m roll.pipeline.tiny_model", description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", required=True)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--preset", choices=sorted([*PRESETS, *VL_PRESETS]), help="take the corpus from a built-in env")
    source.add_argument("--env_type", help="take the corpus from this env (id, alias or module:Class)")
    parser.add_argument("--env_config", type=json.loads, default={}, help="JSON kwargs for --env_type")
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
    parser.add_argument("--tie_word_embeddings", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    if args.env_config and not args.env_type:
        parser.error("--env_config needs --env_type")
    return args


def build_vl_preset(args: argparse.Namespace) -> str:
    """The tiny Qwen2.5-VL of a `vl_*` preset (`--arch` and `--tie_word_embeddings` do not apply)."""
    corpus, extra_tokens = corpus_and_tokens(*PRESETS[VL_PRESETS[args.preset]])
    return build_tiny_vl_model(
        args.output_dir,
        corpus=corpus,
        extra_tokens=extra_tokens,
        hidden_size=args.hidden_size,
        num_hidden_layers=args.num_hidden_layers,
        num_attention_heads=args.num_attention_heads,
        intermediate_size=args.intermediate_size,
        max_position_embeddings=args.max_position_embeddings,
        seed=args.seed,
        overwrite=args.overwrite,
    )


def main(argv: Sequence[str] | None = None) -> str:
    args = _parse_args(argv)
    if args.preset in VL_PRESETS:
        path = build_vl_preset(args)
        print(path)
        return path
    env_type, env_config = PRESETS[args.preset] if args.preset else (args.env_type, args.env_config)
    try:
        corpus, extra_tokens = corpus_and_tokens(env_type, env_config) if env_type else ([], [])
    except (ValueError, TypeError, OSError) as err:  # unknown env_type or env_config keys: one line
        sys.exit(f"python -m roll.pipeline.tiny_model: {err}")
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
