"""Reward for math answers, checked by `math-verify` (HF's verifier for MATH-style answers: LaTeX,
fractions, sets, intervals, equivalent forms) rather than by string match.

Install with `pip install "roll[math]"` (or `pip install math-verify`; its LaTeX parser runs on
the antlr4 4.9 runtime that hydra-core already pins).

math-verify bounds parsing and verification with SIGALRM, which only works in a process's main
thread; agents run in an env worker's event loop, often elsewhere, so the bounds are used only on
the main thread, and the response is cut to its last `MAX_RESPONSE_CHARS` characters so that a
runaway answer cannot keep sympy busy for long.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from typing import Any

try:  # at import: a config naming this reward fn then fails at load, not in every episode
    from math_verify import parse, verify
except ImportError:
    raise ImportError('math_reward needs math-verify: pip install "roll[math]"') from None

log = logging.getLogger(__name__)

MAX_RESPONSE_CHARS = 2000
# How a word-level tokenizer (the tiny model's) decodes "12" and "\boxed": "1 2", "\ boxed"
_SPLIT_DIGITS = re.compile(r"(?<=\d) (?=\d)")
_SPLIT_COMMAND = re.compile(r"\\ (?=[A-Za-z])")
_SPACED_BRACE = re.compile(r" *([{}]) *")  # "\frac { 2 } { 3 }": insignificant spaces in LaTeX
_BOXED = "\\boxed{"


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` of `text` (braces balanced), or None."""
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth, i = 1, start + len(_BOXED)
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def math_reward(row: Mapping[str, Any], response_text: str) -> float:
    """1.0 when the response's final answer equals `row["answer"]` per math-verify, else 0.0.
    Never raises: a missing answer, an unparsable response or a verifier error is 0.0."""
    answer = row.get("answer")
    if answer is None or not str(answer).strip():
        return 0.0
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    response = _SPLIT_DIGITS.sub("", str(response_text)[-MAX_RESPONSE_CHARS:])
    response = _SPACED_BRACE.sub(r"\1", _SPLIT_COMMAND.sub(r"\\", response))
    try:
        gold = parse(f"{_BOXED}{answer}}}", parsing_timeout=timeout)
        guess = parse(response, parsing_timeout=timeout)
        return 1.0 if gold and guess and verify(gold, guess, timeout_seconds=timeout) else 0.0
    except Exception as e:  # the verifier's own failure must not drop the trajectory
        log.debug("math_reward: %s: %s", type(e).__name__, e)
        return 0.0


# math-verify warns on every call made without a timeout (i.e. off the main thread)
logging.getLogger("math_verify").setLevel(logging.ERROR)
