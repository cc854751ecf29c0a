"""The tiny local model + tokenizer builder, and model loading from local HF dirs."""

from roll.models.chat_template import chat_template_ids
from roll.models.loading import (
    load_causal_lm,
    load_tokenizer,
    load_value_model,
    model_dir,
)

__all__ = [
    "chat_template_ids",
    "load_causal_lm",
    "load_tokenizer",
    "load_value_model",
    "model_dir",
]
