"""Print the fields of ROLL's config dataclasses at a commit, read from its source by `ast`.

    python scripts/roll_fields.py GIT_DIR [COMMIT]

GIT_DIR is a clone of alibaba/ROLL (a bare git dir will do). Prints one line per field,
`Class.field = default`, in the order of `roll.configs.roll_compat.table.ROLL_FIELDS`' classes, inherited
fields under the class that declares them. `tests/configs/test_roll_table.py` compares the
table with this when a ROLL clone is found (`ROLL_GIT_DIR`).
"""

from __future__ import annotations

import ast
import subprocess
import sys

FILES = (
    "roll/configs/base_config.py",
    "roll/configs/worker_config.py",
    "roll/configs/model_args.py",
    "roll/configs/training_args.py",
    "roll/configs/generating_args.py",
    "roll/configs/data_args.py",
    "roll/pipeline/agentic/agentic_config.py",
)
SKIPPED_CLASSES = ("RLVRConfig",)  # not in these files; listed for the reader


def roll_fields(git_dir: str, commit: str = "HEAD") -> dict[str, dict[str, str]]:
    """{class name: {field: default source text}} of every dataclass in `FILES` at `commit`."""
    classes: dict[str, dict[str, str]] = {}
    for path in FILES:
        source = subprocess.run(
            ["git", "--git-dir", git_dir, "show", f"{commit}:{path}"], check=True, capture_output=True, text=True
        ).stdout
        for node in ast.parse(source).body:
            if isinstance(node, ast.ClassDef) and any(_is_dataclass(d) for d in node.decorator_list):
                classes[node.name] = dict(_fields(node))
    return classes


def _is_dataclass(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return getattr(target, "id", getattr(target, "attr", None)) == "dataclass"


def _fields(node: ast.ClassDef):
    for statement in node.body:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            yield statement.target.id, _default(statement.value)


def _default(value: ast.expr | None) -> str:
    if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "field":
        for keyword in value.keywords:
            if keyword.arg == "default":
                return ast.unparse(keyword.value)
            if keyword.arg == "default_factory":
                return ast.unparse(keyword.value) + "()"
        return "<required>"
    return "<required>" if value is None else ast.unparse(value)


if __name__ == "__main__":
    for cls, fields in roll_fields(*sys.argv[1:3]).items():
        for name, default in fields.items():
            print(f"{cls}.{name} = {default}")
