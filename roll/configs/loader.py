"""YAML + overrides -> validated `PipelineConfig`, every failure as a one-line `ConfigError`.

Hydra's compose API does the composition (defaults lists, `${...}` interpolation, `key=value`
overrides) without taking over the process (no output dir, no logging setup, no chdir); pydantic
does the validation. This module only translates their exceptions into "KEY: why".
"""

from __future__ import annotations

import difflib
import os
import re
import sys
import types
import typing
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import OverrideType
from hydra.errors import ConfigCompositionException, HydraException, MissingConfigException
from omegaconf import OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException
from pydantic import BaseModel, ValidationError

from roll.configs.base import ConfigError, InvalidField
from roll.configs.pipeline import PipelineConfig
from roll.configs.profile import apply_profile, configs_search_path
from roll.configs.roll_compat.dialect import map_role_strategies, strip_variables
from roll.configs.roll_compat.keys import answer_roll_keys, roll_names_at
from roll.configs.roll_compat.unsupported import refuse_unsupported


def load_config(
    config_path: str, config_name: str, overrides: Sequence[str] = (), rollout_only: bool = False
) -> PipelineConfig:
    """Compose `config_path/config_name.yaml` with hydra `overrides` and validate it.

    `config_path` is a directory, relative to the current directory or absolute.
    Raises `ConfigError` for every problem: missing file, bad YAML, bad override, invalid value.
    `rollout_only` (ROLL's rollout script): the training roles are left out before validation,
    as ROLL's rollout pipeline reads none of them (its configs give `actor_train` a `model_args`
    only); one stderr line names those left out.
    """
    config_dir = os.path.abspath(config_path)
    if not os.path.isdir(config_dir):
        raise ConfigError("config_path", f"{config_path!r} is not a directory")
    _refuse_empty(os.path.join(config_dir, f"{config_name}.yaml"))
    data, referenced = _compose(config_dir, config_name, list(overrides))
    if "profile" in data:
        apply_profile(data, [_override_key(o) for o in overrides])
    if rollout_only:
        dropped = [role for role in ("actor_train", "critic", "reference") if data.pop(role, None) is not None]
        if dropped:
            print(
                f"rollout-only run: {', '.join(dropped)} not used (ROLL's rollout pipeline trains nothing)",
                file=sys.stderr,
            )
    return validate_config(data, referenced)


def _refuse_empty(path: str) -> None:
    """An empty YAML (ROLL ships one) would otherwise be reported as its first missing key."""
    if os.path.isfile(path) and not Path(path).read_text(encoding="utf-8").strip():
        raise ConfigError("config_name", f"{path} is empty: there is no config in it")


def validate_config(data: dict[str, Any], referenced: Collection[str] = frozenset()) -> PipelineConfig:
    """Validate an already composed config (a plain dict), raising `ConfigError`. `referenced`:
    top-level keys the YAML interpolated, which are ROLL-style variables (`roll.configs.roll_compat.dialect`)."""
    data = strip_variables(data, set(referenced), PipelineConfig.model_fields)
    refuse_unsupported(data)  # a ROLL feature roll does not run: named before any other key
    answer_roll_keys(data)  # every other field of ROLL's config classes: its answer (roll.configs.roll_compat.table)
    map_role_strategies(data)
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as err:
        raise _from_validation_error(err) from None


def _compose(config_dir: str, config_name: str, overrides: list[str]) -> tuple[dict[str, Any], set[str]]:
    """The composed config as a plain dict, and the top-level keys it interpolates."""
    try:
        cfg = _compose_adding_schema_keys(config_dir, config_name, overrides)
        referenced = _interpolated_keys(OmegaConf.to_container(cfg, resolve=False))
        return typing.cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)), referenced
    except MissingConfigException as err:
        raise _missing_file_error(err, config_dir, config_name) from None
    except ConfigCompositionException as err:
        raise _composition_error(err, config_name) from None
    except MissingMandatoryValue as err:
        why = "required value is missing (it is ??? in the YAML)"
        raise ConfigError(err.full_key or config_name, why) from None
    except OmegaConfBaseException as err:  # e.g. an interpolation of a key that does not exist
        raise ConfigError(err.full_key or config_name, _first_line(err)) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{mark.name} line {mark.line + 1}" if mark else config_name
        raise ConfigError(where, f"invalid YAML: {getattr(err, 'problem', None) or err}") from None
    except HydraException as err:
        raise ConfigError(config_name, _first_line(err)) from None


def _compose_adding_schema_keys(config_dir: str, config_name: str, overrides: list[str]) -> Any:
    """Hydra composition, where `key=value` also works for a key the YAML leaves at its default.

    Hydra only knows the YAML, so it rejects `adv_estimator=gae` unless the YAML sets
    `adv_estimator` (the user would have to write `+adv_estimator=gae`). The schema knows the
    key: such an override is retried as `+key=value`. Keys outside the schema still fail.
    """
    schema_keys = [_override_key(override) for override in overrides]  # the keys as the user wrote them
    overrides = _into_library_entries(config_dir, config_name, list(overrides))
    changed_keys = [_parse_override(override) for override in overrides]
    while True:
        try:
            with initialize_config_dir(config_dir=config_dir, version_base=None):
                return compose(config_name=config_name, overrides=[*overrides, configs_search_path()])
        except ConfigCompositionException as err:
            cause = err.__cause__
            key = getattr(cause, "full_key", None)
            # the missing key may be the override's own key or a section above it (`critic` for
            # `critic.strategy_args.strategy_name=torch` when the YAML has no critic)
            related = [
                i
                for i, k in enumerate(changed_keys)
                if key is not None and k is not None and (k == key or k.startswith(key + "."))
            ]
            if not related or "not in struct" not in str(cause):
                raise
            index = related[0]
            changed = changed_keys[index]
            assert changed is not None  # `related` holds only keys still to retry
            if not _is_schema_key(schema_keys[index]):  # a typo: name the override's own key
                raise ConfigError(changed, _unknown_key_message(changed.split("."))) from None
            overrides[index] = "+" + overrides[index]
            changed_keys[index] = None  # "+key=value" now, never retried again


_INTERPOLATION = re.compile(r"\$\{(\w+)")


def _interpolated_keys(node: Any) -> set[str]:
    """First components of every `${a.b}` interpolation in the unresolved config."""
    if isinstance(node, dict):
        return set().union(*map(_interpolated_keys, node.values()), set())
    if isinstance(node, list):
        return set().union(*map(_interpolated_keys, node), set())
    return set(_INTERPOLATION.findall(node)) if isinstance(node, str) else set()


def _into_library_entries(config_dir: str, config_name: str, overrides: list[str]) -> list[str]:
    """Overrides inside a tag that the YAML takes whole from the env library
    (`custom_envs.FrozenLake: ${custom_env.TinyFrozenLake}`, ROLL's way) are aimed at the library
    entry: hydra would otherwise replace the interpolation by a dict holding only the overridden
    key (`custom_envs.FrozenLake.env_config.size=5` -> `custom_env.TinyFrozenLake.env_config.size=5`,
    which also reaches any other tag made from that entry)."""
    inside = [
        i
        for i, o in enumerate(overrides)
        if _override_key(o).startswith("custom_envs.") and _override_key(o).count(".") >= 2
    ]
    if not inside:
        return overrides
    # the YAML's tags, with only the overrides that set a whole tag (others may need the schema retry)
    others = [o for o in overrides if _override_key(o).startswith("custom_envs") and _override_key(o).count(".") < 2]
    try:
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            cfg = compose(config_name=config_name, overrides=[*others, configs_search_path()])
        tags = typing.cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=False)).get("custom_envs") or {}
    except Exception:  # noqa: BLE001 - the real composition below reports it, naming the key
        return overrides
    rewritten = list(overrides)
    for i in inside:
        key = _override_key(overrides[i])
        tag, rest = key.split(".", 2)[1:]
        source = _LIBRARY_ENTRY.fullmatch(str(tags.get(tag, "")))
        if source:
            rewritten[i] = overrides[i].replace(key, f"{source.group(1)}.{rest}", 1)
    return rewritten


_LIBRARY_ENTRY = re.compile(r"\$\{(custom_env\.[\w-]+)\}")


def _override_key(override: str) -> str:
    """The dotted key an override sets (`+a.b=1`, `++a.b=1`, `a.b=1` -> "a.b")."""
    return override.split("=", 1)[0].lstrip("+~")


def _parse_override(override: str) -> str | None:
    """The key that a plain `key=value` override changes (None for `+key`, `~key`, ...), or a
    `ConfigError` quoting the override when its syntax is wrong."""
    try:
        (parsed,) = OverridesParser.create().parse_overrides([override])
    except HydraException as err:
        lines = [line for line in str(err).splitlines() if line.strip()]
        details = [line for line in lines if not line.startswith(("Error parsing", "See https"))]
        raise ConfigError(override, f"bad override syntax: {(details or lines)[0]}") from None
    if not parsed.key_or_group:  # hydra takes "=3" for a config group named "" and crashes later
        raise ConfigError(override, "bad override syntax: no key (expected KEY=VALUE)")
    return parsed.key_or_group if parsed.type is OverrideType.CHANGE else None


def _missing_file_error(err: MissingConfigException, config_dir: str, config_name: str) -> ConfigError:
    missing = err.missing_cfg_file or config_name
    if missing == config_name:
        return ConfigError("config_name", f"no {config_name!r} config in {config_dir}")
    group = missing.rsplit("/", 1)[0] if "/" in missing else "defaults"
    return ConfigError(group, f"cannot find config {missing!r}; options: {err.options}")


def _composition_error(err: ConfigCompositionException, config_name: str) -> ConfigError:
    cause = err.__cause__
    if isinstance(cause, OmegaConfBaseException) and cause.full_key:
        if "not in struct" in str(cause):
            return ConfigError(cause.full_key, _unknown_key_message(cause.full_key.split(".")))
        return ConfigError(cause.full_key, _first_line(cause))
    message = _first_line(err)
    if "must be a DictConfig" in message:  # hydra's words for a YAML whose top level is a list
        return ConfigError("config_name", f"{config_name!r} must be a mapping of keys to values")
    # Hydra quotes the key of an override it could not apply ("Could not delete from config.
    # 'x' does not exist."); name that key rather than the overrides as a whole.
    quoted = re.search(r"'([^']+)'", message)
    return ConfigError(quoted.group(1) if quoted else "overrides", message)


def _from_validation_error(err: ValidationError) -> ConfigError:
    """The first pydantic error as "dotted.key: why", with a count of the others."""
    errors = err.errors()
    first = errors[0]
    loc = [str(part) for part in first["loc"]]
    cause = first.get("ctx", {}).get("error")
    if isinstance(cause, InvalidField):
        loc.append(cause.key)
        message = cause.reason
    elif first["type"] == "extra_forbidden":
        message = _unknown_key_message(loc)
    elif first["type"] == "missing":
        message = "required key is missing"
    elif cause is not None:  # our own ValueError from a field validator
        message = str(cause)
    else:
        got = repr(first["input"])
        got = got if len(got) <= 60 else got[:57] + "..."
        message = f"{first['msg'][0].lower()}{first['msg'][1:]} (got {got})"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more error{'s' if len(errors) > 2 else ''})"
    return ConfigError(".".join(loc) or "config", message)


def _unknown_key_message(path: Sequence[str]) -> str:
    """ "unknown key", with the closest valid key of that section as a suggestion."""
    section = _section_model(path[:-1])
    if section is None:
        return "unknown key"
    valid = list(section.model_fields)
    close = difflib.get_close_matches(path[-1], valid + roll_names_at(path[:-1]), n=1)
    if close:
        return f"unknown key (did you mean {close[0]!r}?)"
    return f"unknown key; valid keys here: {', '.join(valid)}"


def _is_schema_key(dotted_key: str) -> bool:
    """A key of roll's models or a field of ROLL's config classes (answered by roll.configs.roll_compat.keys)."""
    path = dotted_key.split(".")
    return _annotation_at(path) is not None or path[-1] in roll_names_at(path[:-1])


def _section_model(path: Sequence[str]) -> type[BaseModel] | None:
    """The config model found at `path` below `PipelineConfig`; None when there is none."""
    return _as_model(_annotation_at(path))


def _annotation_at(path: Sequence[str]) -> Any:
    """The type annotation of the key at `path` below `PipelineConfig`, walking through optional
    sections, dicts of sections (`custom_envs.<Tag>`) and free-form dicts (`env_config`);
    None when no such key exists."""
    annotation: Any = PipelineConfig
    for part in path:
        model = _as_model(annotation)
        if model is not None:
            if part not in model.model_fields:
                return None
            annotation = model.model_fields[part].annotation
        elif typing.get_origin(annotation) is dict:
            annotation = typing.get_args(annotation)[1]
        elif annotation is not Any:
            return None
    return annotation


def _as_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):  # `Section | None`
        return next(filter(None, map(_as_model, typing.get_args(annotation))), None)
    return None


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
