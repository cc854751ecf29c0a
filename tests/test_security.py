"""Source checks: no model output (or anything else) reaches eval/exec or pickle, every torch.load
is weights_only=True, and every server binds 127.0.0.1 only."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for package in ("roll", "envs") for p in (REPO / package).rglob("*.py"))


def calls(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            # owner: None for a bare name (eval(...)), the object's name for x.f(...), "" otherwise
            owner = (
                None
                if isinstance(func, ast.Name)
                else (func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else "")
            )
            yield node, owner, name


def test_sources_were_found():
    assert len(SOURCES) > 50


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_eval_exec_pickle_or_unsafe_torch_load(path):
    for node, owner, name in calls(path):
        where = f"{path.relative_to(REPO)}:{node.lineno}"
        assert not (owner is None and name in {"eval", "exec"}), f"{where}: {name}()"
        assert not (owner in {"pickle", "cloudpickle", "dill"} and name in {"load", "loads"}), (
            f"{where}: {owner}.{name}"
        )
        if owner == "torch" and name == "load":
            safe = any(
                k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                for k in node.keywords
            )
            assert safe, f"{where}: torch.load without weights_only=True"


def test_servers_bind_loopback_only():
    from envs.webshop import server

    assert server.HOST == "127.0.0.1"
    running = server.start_server()
    try:
        assert running.url.startswith("http://127.0.0.1:")
    finally:
        running.stop()
