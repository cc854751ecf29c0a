"""Shared pieces of the config models: the strict base class and the two error types.

Every section of the YAML is a `ConfigModel`: unknown keys are rejected (a typo must fail loudly,
not be silently ignored) and each field's docstring becomes its `description`, so the models are
the reference documentation of the YAML.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from roll.core.errors import BadConfig


class ConfigModel(BaseModel):
    """Base of every config section: strict about keys, documented per field.

    Numbers are strict in two ways that pydantic's defaults are not: `nan`/`inf` are refused (no
    size, rate or weight of a run means them; a `nan` weight poisons every loss silently), and so
    is a boolean where a number belongs (`max_steps: true` is a slip, not 1).
    """

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")  # a "*" validator: always a field's name
        if isinstance(value, bool) and field is not None and _takes_a_number(field.annotation):
            raise ValueError(f"expected a number, not a boolean (got {str(value).lower()})")
        return value


def _takes_a_number(annotation: Any) -> bool:
    """Whether a field of this type takes an int or float (alone or `| None`) and no bool."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    members = typing.get_args(annotation) if union else (annotation,)
    return bool not in members and any(member in (int, float) for member in members)


class InvalidField(ValueError):
    """Raised by a model validator that checks several fields, to say which one is at fault.

    Pydantic locates a model validator's error at the model itself; `key` (dotted, relative to
    that model) lets `roll.configs.loader` name the exact key, e.g.
    `train_env_manager.num_groups_partition` instead of just `train_env_manager`.
    """

    def __init__(self, key: str, reason: str):
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


class ConfigError(BadConfig):
    """A config that cannot be loaded or validated. `str()` is one line, "KEY: why", which the CLI
    prints after "config error: " (exit status 2, `BadConfig`)."""

    def __init__(self, key: str, message: str):
        message = " ".join(line.strip() for line in message.splitlines() if line.strip())
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message
