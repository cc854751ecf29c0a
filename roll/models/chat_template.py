"""Chat-template ids for multi-turn token bookkeeping (env managers and agent loops).

A multi-turn rollout keeps the ids the engine generated and appends what follows each assistant
turn; it never re-renders the history, because a template may render past turns differently from
how they were generated (Qwen3 drops the `<think>` block of every assistant turn before the last
user message) and PPO would then score tokens the policy never produced. `continuation_ids` finds
what to append from a probe conversation, once per distinct set of messages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_PROBE = ({"role": "system", "content": "s"}, {"role": "user", "content": "u"})
_PROBE_ANSWER = "ROLL_PROBE_ANSWER"


def render_text(
    tokenizer, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool, tools: list[dict] | None = None
) -> str:
    """`messages` rendered by the tokenizer's chat template, as text (a content may be a list of
    parts: text and image, as a VL processor's template takes them)."""
    return tokenizer.apply_chat_template(
        [dict(m) for m in messages], tools=tools or None, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def encode(tokenizer, text: str) -> list[int]:
    """`text` (already templated: it holds its own special tokens) as ids, nothing added.

    Uses the Rust tokenizer directly when there is one: what `apply_chat_template(tokenize=True)`
    does, minus a Python wrapper that costs more than the encoding (env managers call this for
    every step)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return backend.encode(text, add_special_tokens=False).ids
    return [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]


def chat_template_ids(tokenizer, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool) -> list[int]:
    """Token ids of `messages` rendered by the tokenizer's chat template, as one flat list."""
    return encode(tokenizer, render_text(tokenizer, messages, add_generation_prompt))


def continuation_ids(tokenizer, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """The ids that follow a generated assistant turn when `messages` (role "user" or "tool") come
    next: what closes the turn, the messages, and the next generation prompt.

    Render a probe conversation whose assistant turn holds a marker, followed by `messages`; cut
    the text right after the marker and tokenize the rest. Comparing the probe's ids with and
    without `messages` is not enough: a Qwen3-style template renders the last assistant turn
    differently from an earlier one, so the probe's own ids change once messages follow it. The
    cut needs the tokenization to be additive at the end of an assistant turn (true when a special
    token such as `<|im_end|>` starts the rest), which is checked. The caller drops the first id
    when the model already emitted it (it closed its turn itself).
    """
    probe = [*_PROBE, {"role": "assistant", "content": _PROBE_ANSWER}]
    text = render_text(tokenizer, probe + [dict(m) for m in messages], add_generation_prompt=True)
    cut = text.find(_PROBE_ANSWER)
    if cut < 0:
        raise ValueError(
            "chat template drops the content of an assistant turn followed by "
            f"{messages[0]['role'] if messages else 'nothing'!r} messages"
        )
    cut += len(_PROBE_ANSWER)
    tail = encode(tokenizer, text[cut:])
    if encode(tokenizer, text[:cut]) + tail != encode(tokenizer, text):
        raise ValueError(
            "chat template: the text after an assistant turn does not tokenize "
            "apart from the turn; its ids cannot be appended to generated ids"
        )
    return tail
