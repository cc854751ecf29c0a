"""Turn raw model text into an action word. Pure functions that never raise.

The policy's text arrives exactly as sampled: it may be cut at `max_new_tokens`, end on a stop
token, carry chat special tokens, or be garbage early in training. Every such case must map to
"an answer" or "no answer" (`None`), never to an exception, because an unparsable action is an
ordinary env step (the env answers it with `format_penalty`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# `<|im_end|>`, `<|endoftext|>`, `<|eot_id|>` (also DeepSeek's full-width `<｜...｜>`) and the
# classic sentencepiece / BERT specials.
_SPECIAL_TOKENS = re.compile(r"<[|｜][^<>|｜\s]*[|｜]>|</?s>|<pad>|<eos>|<unk>", re.IGNORECASE)


def strip_special_tokens(text: str) -> str:
    """`text` with every chat / tokenizer special token removed (wherever it appears)."""
    return _SPECIAL_TOKENS.sub("", text)


def extract_answer(text: str, tag: str = "answer") -> str | None:
    """The stripped content of the first `<tag>…</tag>` block, or None without an opening tag.

    Tags match case-insensitively and with spaces inside (`< ANSWER >`, `</ answer>`). A block ends
    at the first closing tag after the first opening tag, or at the end of the text when there is
    none (a response cut at `max_new_tokens`, or stopped on a stop token). Its content starts after
    the last opening tag before that end, so `<answer><answer>Up</answer></answer>` and
    `<answer>Up<answer>Left` give the innermost, latest text ("Up", "Left").
    """
    if not isinstance(text, str) or not isinstance(tag, str):
        return None
    text = strip_special_tokens(text)
    name = re.escape(tag)
    opening = re.compile(rf"<\s*{name}\s*>", re.IGNORECASE)
    closing = re.compile(rf"<\s*/\s*{name}\s*>", re.IGNORECASE)
    first = opening.search(text)
    if first is None:
        return None
    close = closing.search(text, first.end())
    end = close.start() if close is not None else len(text)
    start = first.end()
    for inner in opening.finditer(text, first.end(), end):
        start = inner.end()
    return text[start:end].strip()


def _normalise(text: str) -> str:
    return " ".join(text.split()).casefold()


def match_choice(content: str | None, choices: Sequence[str]) -> str | None:
    """The choice that `content` names (case-insensitive, whitespace-normalised), else None.

    Returns the canonical spelling from `choices`: `match_choice(" left ", ("Left",)) == "Left"`.
    """
    if not isinstance(content, str):
        return None
    wanted = _normalise(content)
    if not wanted:
        return None
    for choice in choices:
        if _normalise(choice) == wanted:
            return choice
    return None
