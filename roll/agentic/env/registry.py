"""Find an env class from a config's `env_type`, the same way for built-ins and user envs.

`env_type` is a gymnasium id (`roll/FrozenLake-v0`), a short alias (`frozen_lake`) or
`package.module:ClassName`. `roll` never imports the `envs` package by name: packages that ship
envs declare a Python entry point in group `roll.envs` (roll's own pyproject.toml has
`builtin = envs`), and the first lookup loads each one, which registers its envs through
`register_env`. Without an installed entry point (a bare checkout) `import envs` does the same.
An id namespace (`register_env_namespace`: GEM's `game:`, `rg:`, ...) routes every id with that
prefix to one adapter class, built as `cls(env_id=env_type, **env_config)`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any

import gymnasium as gym
import pydantic
from gymnasium.envs.registration import load_env_creator

from roll.agentic.env.base import TextEnv
from roll.agentic.env.faults import FaultInjectingEnv, FaultInjection
from roll.configs.base import InvalidField
from roll.core.imports import ObjectNotFound, import_object

ENTRY_POINT_GROUP = "roll.envs"
_ENTRY_POINTS: dict[str, str] = {}  # env id -> "module:Class", in registration order
_ALIASES: dict[str, str] = {}  # alias -> env id
_NAMESPACES: dict[str, str] = {}  # id prefix ("game:") -> "module:Class" of the adapter


def register_env(env_id: str, entry_point: str, aliases: Sequence[str] = ()) -> None:
    """Register a `TextEnv` with gymnasium under `env_id` and with roll under `aliases`.

    Registering the same id, entry point and aliases again is a no-op (plugins may be imported
    twice); an alias already taken by another id is an error. The gymnasium spec keeps its default
    checker wrappers for `gym.make` users; roll itself builds the raw class (`make_env`).
    """
    for alias in aliases:
        if _ALIASES.get(alias, env_id) != env_id:
            raise ValueError(f"env alias {alias!r} already names {_ALIASES[alias]!r}")
    if _ENTRY_POINTS.get(env_id) != entry_point:
        gym.register(id=env_id, entry_point=entry_point)
        _ENTRY_POINTS[env_id] = entry_point
    _ALIASES.update(dict.fromkeys(aliases, env_id))


def register_env_namespace(prefixes: Sequence[str], entry_point: str) -> None:
    """Route every `env_type` that starts with one of `prefixes` (GEM's "game:", "rg:", ...) to
    the `TextEnv` class at `entry_point`, built as `cls(env_id=env_type, **env_config)`. The
    class's `check_env_id(env_id)` (a classmethod, if it has one) refuses an id by name."""
    for prefix in prefixes:
        if _NAMESPACES.get(prefix, entry_point) != entry_point:
            raise ValueError(f"env id prefix {prefix!r} already routes to {_NAMESPACES[prefix]!r}")
        _NAMESPACES[prefix] = entry_point


def namespace_of(env_type: str) -> str | None:
    """The adapter entry point that `env_type` is routed to by its prefix, or None."""
    load_plugins()
    return next((ep for prefix, ep in _NAMESPACES.items() if env_type.startswith(prefix)), None)


@functools.cache
def load_plugins() -> tuple[str, ...]:
    """Load every `roll.envs` entry point once (a module registers on import; a callable is
    called). Returns their names. A plugin that fails to load is an error naming it."""
    names = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = ep.load()
            if callable(loaded):
                loaded()
        except Exception as e:
            where = f"{ENTRY_POINT_GROUP} entry point '{ep.name} = {ep.value}'"
            raise RuntimeError(f"{where} failed to load: {e}") from e
        names.append(ep.name)
    return tuple(names)


def list_envs() -> list[str]:
    """Ids of every env registered through `register_env` (plugins loaded), sorted."""
    load_plugins()
    return sorted(_ENTRY_POINTS)


def _unknown(env_type: str, why: str = "") -> ValueError:
    known = ", ".join(sorted({*_ENTRY_POINTS, *_ALIASES})) or "none"
    hint = ""
    if not load_plugins():
        hint = f" (no '{ENTRY_POINT_GROUP}' entry point installed: pip install -e . or import envs)"
    return ValueError(f"unknown env_type {env_type!r}{why}; known: {known}{hint}")


def _import_class(env_type: str) -> Any:
    try:
        return import_object(env_type)
    except ObjectNotFound as e:
        raise _unknown(env_type, f" ({e})") from None


def resolve_env_class(env_type: str) -> type[TextEnv]:
    """The `TextEnv` subclass that `env_type` (id, alias or "module:Class") names."""
    load_plugins()
    routed = namespace_of(env_type)
    if routed is not None:
        cls = _import_class(routed)
        if callable(getattr(cls, "check_env_id", None)):
            cls.check_env_id(env_type)
    elif ":" in env_type:
        cls = _import_class(env_type)
    else:
        env_id = _ALIASES.get(env_type, env_type)
        if env_id not in gym.registry:
            raise _unknown(env_type)
        creator = gym.registry[env_id].entry_point
        cls = load_env_creator(creator) if isinstance(creator, str) else creator
    if not (isinstance(cls, type) and issubclass(cls, TextEnv)):
        raise ValueError(f"env_type {env_type!r} names {cls!r}, which is not a TextEnv subclass")
    return cls


FAULT_INJECTION_KEY = "fault_injection"  # an env_config key of every env: see roll.agentic.env.faults


def check_env_config(env_type: str, env_config: Mapping[str, Any]) -> type[TextEnv]:
    """The class of `env_type`, after checking that its constructor takes every `env_config`
    key (besides `fault_injection`, which any env takes): an unknown key is a one-line TypeError
    naming it and the accepted ones. Cheap, so config validation can call it long before any env
    is built."""
    cls = resolve_env_class(env_type)
    if FAULT_INJECTION_KEY in env_config:
        _check_fault_injection(env_config[FAULT_INJECTION_KEY])
        env_config = {k: v for k, v in env_config.items() if k != FAULT_INJECTION_KEY}
    params = inspect.signature(cls).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(env_config) - set(params))
        if unknown:
            raise TypeError(
                f"unknown env_config key(s) {', '.join(map(repr, unknown))} for env_type "
                f"{env_type!r} ({cls.__name__}); accepted: {', '.join(params) or 'none'}"
            )
    return cls


def _check_fault_injection(block: Any) -> None:
    """A bad `fault_injection` block as a one-line `InvalidField` (a ValueError) naming the key."""
    try:
        FaultInjection.model_validate(block or {})
    except pydantic.ValidationError as err:
        first = err.errors()[0]
        key = ".".join([FAULT_INJECTION_KEY, *map(str, first["loc"])])
        reason = first["msg"].removeprefix("Value error, ")
        raise InvalidField(key, reason[:1].lower() + reason[1:]) from None


def make_env(env_type: str, env_config: Mapping[str, Any]) -> TextEnv | FaultInjectingEnv:
    """A raw (no gymnasium checker wrappers) instance of `env_type` built with `**env_config`,
    wrapped in a `FaultInjectingEnv` when `env_config` has a `fault_injection` block."""
    cls: Callable[..., TextEnv] = check_env_config(env_type, env_config)  # a subclass: more keys, checked
    kwargs = {k: v for k, v in env_config.items() if k != FAULT_INJECTION_KEY}
    env = cls(env_id=env_type, **kwargs) if namespace_of(env_type) else cls(**kwargs)
    if env_config.get(FAULT_INJECTION_KEY):
        return FaultInjectingEnv(env, FaultInjection.model_validate(env_config[FAULT_INJECTION_KEY]))
    return env


def text_env_of(env: gym.Env) -> TextEnv:
    """The TextEnv inside `env`'s wrappers (`make_env` adds one for a `fault_injection` block)."""
    inner = env.unwrapped
    if not isinstance(inner, TextEnv):
        raise TypeError(f"{type(inner).__name__} is not a TextEnv")
    return inner
