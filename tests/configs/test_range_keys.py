"""Every range-checked config field, set out of range on the command line, is reported under the
key the user wrote (issue 31: `seed=-5` was blamed on `custom_envs.<tag>.env_config`, and
`train_env_manager.group_size=-8` under `+profile=cpu_smoke` on `rollout_batch_size`).

The fields are found by walking the config models (a `ge`/`gt`/`le`/`lt` bound in their
metadata), so a field added later is covered without editing this file. Each is tried alone on
`minimal_agentic.yaml`, with and without the cpu_smoke profile (which rewrites batch and group
sizes from each other).
"""

from __future__ import annotations

import os
import types
import typing

import annotated_types
import pytest
from pydantic import BaseModel

from roll.configs import ConfigError, load_config
from roll.configs.pipeline import PipelineConfig

CONFIG_DIR = os.path.dirname(os.path.abspath(__file__))
# Where the walk enters sections that are dicts or optional in minimal_agentic.yaml.
DICT_ENTRIES = {"custom_envs": "SimpleFrozenLake"}
SKIPPED_SECTIONS = {"critic", "reference", "val_env_manager"}  # the same models as actor_train, train_env_manager


def _model_of(annotation) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return next(filter(None, map(_model_of, typing.get_args(annotation))), None)
    if typing.get_origin(annotation) is dict:
        return _model_of(typing.get_args(annotation)[1])
    return None


def _out_of_range(field) -> object | None:
    """A value just outside the field's first bound, of the field's own number type."""
    integer = int in typing.get_args(field.annotation) or field.annotation is int
    step = 1 if integer else 0.5
    for bound in field.metadata:
        if isinstance(bound, annotated_types.Ge):
            return bound.ge - 2 * step  # -1 would be top_k's "off"
        if isinstance(bound, annotated_types.Gt):
            return bound.gt
        if isinstance(bound, annotated_types.Le):
            return bound.le + step
        if isinstance(bound, annotated_types.Lt):
            return bound.lt
    return None


def range_checked_fields(model: type[BaseModel] = PipelineConfig, prefix: str = "") -> list[tuple[str, object]]:
    """(dotted key, a value out of its range) for every bounded number field below `model`."""
    found = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        if key in SKIPPED_SECTIONS:
            continue
        section = _model_of(field.annotation)
        if section is not None:
            entry = f".{DICT_ENTRIES[name]}" if typing.get_origin(field.annotation) is dict else ""
            found += range_checked_fields(section, f"{key}{entry}.")
            continue
        value = _out_of_range(field)
        if value is not None:
            found.append((key, value))
    return found


FIELDS = range_checked_fields()


def test_the_walk_finds_the_fields_of_the_issue():
    keys = dict(FIELDS)
    assert keys["seed"] == -2 and keys["train_env_manager.group_size"] == -1
    assert "actor_train.training_args.learning_rate" in keys and "custom_envs.SimpleFrozenLake.max_steps" in keys
    assert len(FIELDS) > 40


@pytest.mark.parametrize("profile", [False, True], ids=["plain", "cpu_smoke"])
@pytest.mark.parametrize(("key", "value"), FIELDS, ids=[key for key, _ in FIELDS])
def test_an_out_of_range_value_is_named_by_its_key(key, value, profile, model_dir):
    overrides = [f"pretrain={model_dir}", f"{key}={value}"] + (["+profile=cpu_smoke"] if profile else [])
    with pytest.raises(ConfigError) as err:
        load_config(CONFIG_DIR, "minimal_agentic", overrides)
    assert err.value.key == key, str(err.value)


@pytest.mark.parametrize("value", [-5, -8])
def test_a_negative_seed_is_named_seed(value, model_dir):
    with pytest.raises(ConfigError, match=rf"^seed: input should be greater than or equal to 0 \(got {value}\)$"):
        load_config(CONFIG_DIR, "minimal_agentic", [f"pretrain={model_dir}", f"seed={value}"])
