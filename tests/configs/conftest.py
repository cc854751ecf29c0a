"""Fixtures shared by the config tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def model_dir(tmp_path) -> str:
    """A stand-in model dir: the config only checks that config.json exists."""
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text("")
    return str(path)
