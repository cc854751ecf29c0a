"""docs/configuration.md is generated from the config models: up to date, and every field is on it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from roll.configs.pipeline import PipelineConfig

ROOT = Path(__file__).resolve().parent.parent.parent
_spec = importlib.util.spec_from_file_location("config_reference", ROOT / "scripts" / "config_reference.py")
config_reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(config_reference)


def test_the_page_is_what_the_script_prints() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert page == config_reference.render(), "run: python scripts/config_reference.py --write"


def test_every_field_of_every_model_has_an_entry_with_its_docstring() -> None:
    page = config_reference.render()
    models = config_reference.walk(PipelineConfig)
    assert {m.__name__ for m, _ in models} >= {"PipelineConfig", "WorkerConfig", "CustomEnvConfig", "TrainingArgs"}
    for model, _ in models:
        section = page.split(f"## {model.__name__}\n", 1)[1].split("\n## ", 1)[0]
        for name, field in model.model_fields.items():
            assert f"**`{name}`** · " in section, f"{model.__name__}.{name} missing"
            first_line = (field.description or "").strip().splitlines()[0]
            assert first_line in section, f"{model.__name__}.{name}: docstring missing"


def test_types_defaults_and_paths_are_spelled_as_in_yaml() -> None:
    page = config_reference.render()
    assert "*Where: `actor_train`, `actor_infer`, `critic`, `reference`.*" in page
    assert "*Where: `custom_envs.<name>`.*" in page
    assert "**`seed`** · `int`" in page
    assert "**`strategy_args`** · `StrategyArgs` ([StrategyArgs](#strategyargs)) · default: `required`" in page
