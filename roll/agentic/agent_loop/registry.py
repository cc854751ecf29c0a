"""Find an agent class by name, and load an agent's YAML config.

Agents register under a short name with `@register("name")`, the way envs do: a config then says
`agent_name: tool_agent` and never imports the class. A user's agent may also be named by its
import path, `package.module:ClassName`, so it works without being imported first.

The config an agent reads is an OmegaConf `DictConfig` (`self.cfg.max_turns`): the same object
whether it came from a YAML file (`load_agent_cfg`), a hydra group or a plain dict. It is created
with `allow_objects`, so a test or a notebook may put a Python callable (a reward fn, a tool) in it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol, TypeVar, cast

from omegaconf import DictConfig, OmegaConf

from roll.core.imports import ObjectNotFound, import_object


class RegisteredAgent(Protocol):
    """What the registry knows of an agent class (`base.AgentLoop` is one): its name, and that it
    is built from (cfg, client, tokenizer)."""

    agent_name: ClassVar[str]

    def __init__(self, cfg: Any, client: Any, tokenizer: Any) -> None: ...


_AGENTS: dict[str, type[RegisteredAgent]] = {}
_LAZY: dict[str, tuple[str, str]] = {
    "math_graph": ("roll.agentic.agent_loop.math_graph:MathGraphAgent", 'LangGraph: pip install -e ".[agents]"'),
}
"""Built-in agents imported on first use: LangGraph takes seconds to import, and every env worker
imports this package."""
T = TypeVar("T", bound=type[RegisteredAgent])


def register(name: str) -> Callable[[T], T]:
    """Class decorator: make the agent class known as `name`. A name taken by another class is an
    error (two agents silently answering to one name would train the wrong loop)."""

    def wrap(cls: T) -> T:
        known = _AGENTS.get(name)
        if known is not None and known is not cls:
            raise ValueError(f"agent name {name!r} is already registered by {known.__module__}.{known.__qualname__}")
        _AGENTS[name] = cls
        cls.agent_name = name
        return cls

    return wrap


def list_agents() -> list[str]:
    """Names of every registered agent (and built-in agents not imported yet), sorted."""
    return sorted(set(_AGENTS) | set(_LAZY))


def get_agent_class(name: str) -> type[RegisteredAgent]:
    """The class registered as `name`, or imported from `package.module:ClassName`; anything else
    is a one-line error that lists the known names."""
    if ":" in name:
        return _import_class(name)
    if name not in _AGENTS and name in _LAZY:
        path, needs = _LAZY[name]
        try:
            return _import_class(path)
        except ModuleNotFoundError as e:
            raise ValueError(f"agent {name!r} needs {needs} (no module {e.name!r})") from None
    if name not in _AGENTS:
        raise ValueError(
            f"unknown agent {name!r}; known: {', '.join(list_agents()) or 'none'} (or give package.module:ClassName)"
        )
    return _AGENTS[name]


def _import_class(path: str) -> type[RegisteredAgent]:
    try:
        return import_object(path)
    except ObjectNotFound as e:
        raise ValueError(f"unknown agent {path!r} ({e})") from None


def to_cfg(cfg: Mapping[str, Any] | DictConfig | None) -> DictConfig:
    """`cfg` as a DictConfig that may also hold Python objects (callables)."""
    if isinstance(cfg, DictConfig):  # a DictConfig's container is a dict (the stub says any container)
        cfg = cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True))
    return OmegaConf.create(dict(cfg or {}), flags={"allow_objects": True})


def load_agent_cfg(path: str | os.PathLike[str]) -> DictConfig:
    """The YAML file at `path` as a DictConfig (interpolations resolved when read). A missing file
    or a file that is not a mapping is a one-line error naming the path."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"agent config {path!r} does not exist")
    loaded = OmegaConf.load(path)
    if not isinstance(loaded, DictConfig):
        raise ValueError(f"agent config {path!r} is not a mapping of keys to values")
    return to_cfg(loaded)


def make_agent(
    name: str, cfg: Mapping[str, Any] | DictConfig | str | os.PathLike[str] | None, client: Any, tokenizer: Any
) -> Any:
    """Build the agent `name` (an `AgentLoop`) from a config mapping or the path of its YAML file
    (the edge where config becomes an object). The registry knows names and classes only: it
    does not import `base.AgentLoop`, which imports it (`@register`)."""
    if isinstance(cfg, (str, os.PathLike)):
        cfg = load_agent_cfg(cfg)
    return get_agent_class(name)(cfg, client, tokenizer)
