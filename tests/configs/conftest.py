"""Fixtures shared by the config tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def _tiny_model_dir(tmp_path_factory) -> str:
    from roll.models.tiny import build_tiny_model

    return build_tiny_model(str(tmp_path_factory.mktemp("model") / "m"), corpus=["You are P."], seed=0)


@pytest.fixture
def model_dir(_tiny_model_dir, tmp_path, monkeypatch) -> str:
    """A real tiny model dir (built once): the CLI's pre-start checks load its config.json and
    tokenizer. The test runs in its own directory, so a config's relative `./output` is its own."""
    monkeypatch.chdir(tmp_path)
    return _tiny_model_dir
