"""Template vocabularies the config checks: ROLL's chat-template names (the Jinja texts are in
`roll.models.templates`) and the placeholders of ROLL's `agent_template` (filled by
`roll.agentic.templates`). Data and string checks only, so the config can read them."""

from __future__ import annotations

import string

TEMPLATE_NAMES = ("native", "qwen2_5", "qwen2", "qwen3", "chatml", "llama3")
"""ROLL's `data_args.template` names we render ("native": the tokenizer's own)."""


def check_template_name(name: str) -> str:
    """`name` if it is a known template, else a ValueError listing them."""
    if name not in TEMPLATE_NAMES:
        raise ValueError(f"{name!r} is not a known chat template; known: {', '.join(TEMPLATE_NAMES)}")
    return name


TRAJ_FIELDS = ("observation", "turn_idx", "actions_left", "max_response_length", "suffix")
STEP_FIELDS = (
    "env_instruction",
    "history",
    "step_count",
    "history_length",
    "current_step",
    "current_observation",
    "max_response_length",
)


def placeholders(template: str) -> set[str]:
    return {field for _, field, _, _ in string.Formatter().parse(template) if field is not None}


def check_agent_template(template: str) -> None:
    """ValueError naming a placeholder that neither manager type fills (or a malformed one)."""
    try:
        fields = placeholders(template)
    except ValueError as err:
        raise ValueError(f"not a str.format template: {err}") from None
    unknown = sorted(fields - set(TRAJ_FIELDS) - set(STEP_FIELDS))
    if unknown:
        raise ValueError(
            f"unknown placeholder {{{unknown[0]}}}; trajectory-wise: "
            f"{', '.join(TRAJ_FIELDS)}; step-wise: {', '.join(STEP_FIELDS)}"
        )
