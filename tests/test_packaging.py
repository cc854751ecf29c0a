"""pyproject.toml: the package metadata, the `roll.envs` entry point and the `roll` console script;
the pre-commit hooks make the checks of .ci/run."""

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

import roll.console

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_dependencies_come_from_requirements_txt(project: dict) -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["dynamic"] == ["dependencies"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["dependencies"] == {"file": ["requirements.txt"]}


def test_builtin_envs_entry_point_and_console_script(project: dict) -> None:
    assert project["entry-points"]["roll.envs"] == {"builtin": "envs"}
    assert project["scripts"] == {"roll": "roll.console:main"}


def test_test_extra_carries_the_ci_tools(project: dict) -> None:
    names = {req.split(">")[0].split("=")[0].split("<")[0] for req in project["optional-dependencies"]["test"]}
    assert {"pytest", "ruff", "mypy", "mkdocs", "mkdocs-material", "pre-commit"} <= names


def test_the_pre_commit_hooks_run_the_checks_of_ci() -> None:
    import yaml

    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = [hook for repo in config["repos"] for hook in repo["hooks"]]
    ci = (ROOT / ".ci" / "run").read_text()
    checks = [m.group(1).strip() for m in re.finditer(r"^((?:ruff|mypy)[^|#\n]*)\|\| exit 1", ci, flags=re.M)]
    assert checks == ["ruff format --check .", "ruff check .", "mypy"]
    assert [hook["entry"] for hook in hooks] == checks
    assert all(hook["language"] == "system" and hook["pass_filenames"] is False for hook in hooks)
    if shutil.which("pre-commit"):  # the test extra installs it
        proc = subprocess.run(
            ["pre-commit", "validate-config", ".pre-commit-config.yaml"], cwd=ROOT, capture_output=True
        )
        assert proc.returncode == 0, proc.stderr


def test_test_extra_carries_the_trackers_so_ci_reads_back_real_runs(project: dict) -> None:
    extras = project["optional-dependencies"]
    assert set(extras["trackers"]) <= set(extras["test"])


def test_console_script_finds_the_examples_folder_and_runs_the_cli(monkeypatch, capsys) -> None:
    assert roll.console.examples_dir() == str(ROOT / "examples")
    monkeypatch.chdir(ROOT / "tests")  # a relative --config_path resolves through examples/
    monkeypatch.setattr("sys.argv", ["roll", "--config_path", "frozen_lake", "--config_name", "no_such_config"])
    assert roll.console.main() == 2
    assert "no 'no_such_config' config in" in capsys.readouterr().err
