"""Every ROLL field in a composed config gets its answer from the table, before validation.

`answer_roll_keys(data)` walks the YAML (a plain dict) alongside ROLL's classes
(`roll.configs.roll_compat.table`): a refused field whose value is not off is a `ConfigError` naming the
key and why; a no-op field, or a refused one that is off, is dropped; a supported one, or any field
roll's models have (whose validators refuse what they refuse), is left to those models. A key
that is neither ROLL's nor roll's reaches pydantic and fails there as "unknown key", whose
did-you-mean looks among both roll's and ROLL's names (`roll_names_at`). Two supported keys are
translated here, as they are ROLL's spelling of roll's fields (`TRANSLATED`): `response_length`
and `use_pg_clip_range`.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from roll.configs.base import ConfigError
from roll.configs.pipeline import PipelineConfig
from roll.configs.roll_compat.answers import Answer
from roll.configs.roll_compat.table import ROLL_TABLE, TOP_LEVEL

TRANSLATED = frozenset({"response_length", "use_pg_clip_range"})
"""Top-level ROLL keys that roll supports by rewriting them into its own fields."""
_ROLL_PROMPT_LENGTH = 1024  # ROLL's default prompt_length
_ROLL_PG_CLIP_RANGE = 0.2  # ROLL's default pg_clip_low and pg_clip_high


def answer_roll_keys(data: dict[str, Any]) -> None:
    """Apply the table to `data` in place (see the module docstring); raise `ConfigError`."""
    _translate(data)
    _walk(data, "", TOP_LEVEL, PipelineConfig)


def lookup(classes: Sequence[str], key: str) -> Answer | None:
    """The answer of the first of `classes` that has field `key`; None when none has."""
    return next((ROLL_TABLE[cls][key] for cls in classes if key in ROLL_TABLE[cls]), None)


def roll_names_at(path: Sequence[str]) -> list[str]:
    """ROLL's field names of the mapping at dotted `path` (list indices skipped), for did-you-mean."""
    classes: Sequence[str] = TOP_LEVEL
    for part in path:
        if part.isdigit():
            continue
        answer = lookup(classes, part)
        if answer is None or not answer.section:
            return []
        classes = answer.section
    return [name for cls in classes for name in ROLL_TABLE[cls]]


def _walk(mapping: dict[str, Any], path: str, classes: Sequence[str], model: type[BaseModel] | None) -> None:
    for key in list(mapping):
        answer = lookup(classes, key)
        if answer is None:
            continue
        where, value = path + key, mapping[key]
        ours = model is not None and key in model.model_fields  # then roll's model owns its checks
        if not ours and not answer.accepts(value):
            raise ConfigError(where, f"{answer.why} (ROLL's key; accepted only as {_off_values(answer)})")
        inner = _model(model.model_fields[key].annotation) if ours and model is not None else None
        if answer.section:
            for place, item in _items(where, value):
                _walk(item, place + ".", answer.section, inner)
        if not ours and answer.kind != "supported":
            _refuse_leftovers(where, value, answer)
            del mapping[key]


def _items(where: str, value: Any):
    """The mappings inside a section's value: itself, or each mapping of a list (ROLL's `filters`)."""
    if isinstance(value, dict):
        yield where, value
    elif isinstance(value, list):
        yield from ((f"{where}.{i}", item) for i, item in enumerate(value) if isinstance(item, dict))


def _refuse_leftovers(where: str, value: Any, answer: Answer) -> None:
    """A section roll does not have keeps no key that ROLL's class does not have either."""
    if not (answer.section and isinstance(value, dict) and value):
        return
    key = next(iter(value))
    names = [name for cls in answer.section for name in ROLL_TABLE[cls]]
    close = difflib.get_close_matches(key, names, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"valid keys here: {', '.join(names)}"
    raise ConfigError(f"{where}.{key}", f"unknown key ({hint})")


def _off_values(answer: Answer) -> str:
    shown = [repr(v) if not isinstance(v, bool) and v is not None else str(v).lower() for v in answer.off]
    return " / ".join(s.replace("None", "null") for s in shown) or "absent"


def _translate(data: dict[str, Any]) -> None:
    """ROLL's `response_length` and `use_pg_clip_range` as roll's own fields, with ROLL's meaning."""
    if "response_length" in data:
        response_length = data.pop("response_length")
        prompt_length = data.pop("prompt_length", None) or _ROLL_PROMPT_LENGTH
        if data.get("sequence_length") is None and response_length is not None:
            data["sequence_length"] = prompt_length + response_length
    if "use_pg_clip_range" in data:
        if data.pop("use_pg_clip_range"):  # ROLL's bounds, with ROLL's defaults for the ones left out
            data.setdefault("pg_clip_low", _ROLL_PG_CLIP_RANGE)
            data.setdefault("pg_clip_high", _ROLL_PG_CLIP_RANGE)
        else:  # ROLL clips by pg_clip and ignores the two
            data.pop("pg_clip_low", None)
            data.pop("pg_clip_high", None)


def _model(annotation: Any) -> type[BaseModel] | None:
    """The config model inside `annotation` (`Model`, `Model | None`, `list[Model]`), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next(filter(None, map(_model, typing.get_args(annotation))), None)
