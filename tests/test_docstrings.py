"""Module docstrings stay short: a module docstring states what the module is and its contract;
layouts and long explanations belong in the feature's page under docs/ (../shared/STYLE.md).

Read from the source with `ast`; nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("roll", "envs")
MAX_MODULE_DOCSTRING_LINES = 25  # source lines, the opening and closing quotes included


def module_docstring_lines(source: str) -> int:
    """Source lines the module docstring spans (0 without one)."""
    body = ast.parse(source).body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        if isinstance(body[0].value.value, str):
            return (body[0].end_lineno or body[0].lineno) - body[0].lineno + 1
    return 0


def test_the_line_count_covers_the_quotes():
    assert module_docstring_lines('"""One line."""\nx = 1\n') == 1
    assert module_docstring_lines('"""Title.\n\nBody.\n"""\n') == 4
    assert module_docstring_lines("# a comment\nx = 1\n") == 0


def test_no_module_docstring_is_longer_than_the_limit():
    too_long = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            lines = module_docstring_lines(path.read_text(encoding="utf-8"))
            if lines > MAX_MODULE_DOCSTRING_LINES:
                too_long.append(f"{path.relative_to(ROOT)}: {lines} lines")
    assert not too_long, (
        f"module docstrings over {MAX_MODULE_DOCSTRING_LINES} lines (move the explanation to the "
        "feature's page under docs/): " + "; ".join(too_long)
    )
