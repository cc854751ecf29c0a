"""The docs site (mkdocs.yml, docs/) builds in strict mode, and strict mode catches a broken link."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build(root: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    return subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    result = build(ROOT, tmp_path / "site")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "site" / "configuration" / "index.html").is_file()
    assert (tmp_path / "site" / "engines" / "megatron" / "index.html").is_file()


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    with open(tmp_path / "docs" / "async.md", "a", encoding="utf-8") as page:
        page.write("\nSee [a page that does not exist](no_such_page.md).\n")
    result = build(tmp_path, tmp_path / "site")
    assert result.returncode != 0
    assert "no_such_page.md" in result.stderr


def test_the_results_page_cites_no_issue_numbers() -> None:
    page = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert not re.search(r"\bissues? #?\d+|(?<![\w&])#\d+\b", page, re.IGNORECASE)
