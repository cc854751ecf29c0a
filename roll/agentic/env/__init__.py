"""Text environments: the `TextEnv` base class, the env registry and action parsing helpers."""

from roll.agentic.env.base import TextEnv
from roll.agentic.env.parsing import extract_answer, match_choice, strip_special_tokens
from roll.agentic.env.registry import (
    check_env_config,
    list_envs,
    load_plugins,
    make_env,
    register_env,
    register_env_namespace,
    resolve_env_class,
)

__all__ = [
    "TextEnv",
    "check_env_config",
    "extract_answer",
    "list_envs",
    "load_plugins",
    "make_env",
    "match_choice",
    "register_env",
    "register_env_namespace",
    "resolve_env_class",
    "strip_special_tokens",
]
