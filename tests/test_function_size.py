"""No function in roll/ or envs/ runs over 60 lines: a longer one is split into named pieces.

Lines are counted from the `def` line to the function's last line (docstring and comments
included, decorators not), nested functions separately. Read with `ast`; nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("roll", "envs")
MAX_FUNCTION_LINES = 60


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int, int]]:
    """(name, first line, lines) of every function or method in `source` longer than `limit`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > limit:
                found.append((node.name, node.lineno, lines))
    return found


def test_the_count_runs_from_def_to_the_last_line():
    source = "@decorator\ndef f():\n    x = 1\n\n    return x\n\n\nasync def g():\n    pass\n"
    assert long_functions(source, limit=3) == [("f", 2, 4)]
    assert long_functions(source, limit=4) == []
    nested = "def outer():\n    def inner():\n        a = 1\n        return a\n    return inner\n"
    assert long_functions(nested, limit=3) == [("outer", 1, 5)]


def test_no_function_is_longer_than_the_limit():
    too_long = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for name, line, lines in long_functions(path.read_text(encoding="utf-8")):
                too_long.append(f"{path.relative_to(ROOT)}:{line} {name}: {lines} lines")
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines (split them): " + "; ".join(too_long)
