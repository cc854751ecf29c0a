"""Chat templates by ROLL's names (`data_args.template`), so a ROLL config's choice of template
means what it means in ROLL: the prompt is rendered with that family's chat format whatever the
tokenizer ships with. "native" keeps the tokenizer's own `chat_template`.

The templates are written here as Jinja strings in the shape `transformers.apply_chat_template`
renders (messages with role/content, `add_generation_prompt`), one per model family.
"""

from __future__ import annotations

from roll.configs.templates import TEMPLATE_NAMES, check_template_name

_QWEN2_5 = (
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""Qwen2.5 (ChatML with Qwen's default system message when none is given)."""

_QWEN3 = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""Qwen3 (ChatML, no default system message)."""

_LLAMA3 = (
    "{{- bos_token or '' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
"""Llama 3 / 3.1 header format."""

_CHATML = _QWEN3

CHAT_TEMPLATES: dict[str, str | None] = {
    "native": None,
    "qwen2_5": _QWEN2_5,
    "qwen2": _QWEN2_5,
    "qwen3": _QWEN3,
    "chatml": _CHATML,
    "llama3": _LLAMA3,
}
"""ROLL's template names -> Jinja chat template (None: the tokenizer's own)."""


if set(CHAT_TEMPLATES) != set(TEMPLATE_NAMES):  # the config accepts exactly the names rendered here
    raise RuntimeError(f"chat templates {sorted(CHAT_TEMPLATES)} != config names {sorted(TEMPLATE_NAMES)}")


def apply_template(tokenizer, name: str | None):
    """Give `tokenizer` the chat template `name` (None or "native": leave it as it is)."""
    template = CHAT_TEMPLATES[check_template_name(name)] if name else None
    if template is not None:
        tokenizer.chat_template = template
    return tokenizer
