"""Shared pieces of the config models: the strict base class and the two error types.

Every section of the YAML is a `ConfigModel`: unknown keys are rejected (a typo must fail loudly,
not be silently ignored) and each field's docstring becomes its `description`, so the models are
the reference documentation of the YAML.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigModel(BaseModel):
    """Base of every config section: strict about keys, documented per field."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


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


class ConfigError(Exception):
    """A config that cannot be loaded or validated. `str()` is one line, "KEY: why", which the CLI
    prints as is."""

    def __init__(self, key: str, message: str):
        message = " ".join(line.strip() for line in message.splitlines() if line.strip())
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message
