"""The floors of docs/architecture.md, checked on the import graph of roll/ and envs/.

The graph is read from the source with `ast` (scripts/import_graph.py): every import counts,
at module level, inside functions and under `TYPE_CHECKING`. Nothing is imported, so this is fast.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
import_graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(import_graph)

GROUND = ("roll.core", "roll.utils")


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph.import_graph(ROOT)


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def violations(
    graph, importers: tuple[str, ...], forbidden: tuple[str, ...] = (), *, allowed: tuple[str, ...] | None = None
) -> list[str]:
    """`a -> b` for every import of a module under `importers` that is under `forbidden`, or (with
    `allowed`) that is a roll module outside `allowed`."""
    found = []
    for module, targets in sorted(graph.items()):
        if not _within(module, importers):
            continue
        for target in sorted(targets):
            bad = (
                _within(target, forbidden)
                if allowed is None
                else _within(target, ("roll", "envs")) and not _within(target, allowed)
            )
            if bad:
                found.append(f"{module} -> {target}")
    return found


def test_the_graph_sees_every_kind_of_import(graph):
    # a function-level import and a TYPE_CHECKING one are edges too
    assert "roll.distributed.strategies.registry" in graph
    assert "roll.core.imports" in graph["roll.distributed.strategies.registry"]
    assert "roll.configs.worker" in graph["roll.distributed.strategies.registry"]  # under TYPE_CHECKING
    assert "roll.agentic.agent_loop.dataset" in graph["roll.pipeline.tiny_model"]  # inside a function


def test_no_import_cycles_between_files(graph):
    assert import_graph.cycles(graph) == []


def test_every_floor_imports_only_floors_below_it(graph):
    # core < configs < algorithms, models < agentic, distributed < tracking, envs < pipeline
    assert import_graph.upward_imports(graph) == []


def test_every_room_imports_only_rooms_below_it(graph):
    # agentic: env, sandbox < episode, generation, gateway, templates < agent_loop < proxy
    #   < env_manager < rollout < play;  pipeline: phases < failures < setup < checks < the pipelines
    #   and their tools (roll/pipeline itself) < roll/cli.py < roll/console.py
    assert import_graph.upward_room_imports(graph) == []
    assert import_graph.unplaced_modules(graph) == []


def test_each_pipeline_module_is_in_the_room_of_its_folder(graph):
    rooms = {m: import_graph.room_of(m)[1] for m in graph if m.startswith("roll.pipeline.")}
    assert rooms["roll.pipeline.phases.batch"] == "roll.pipeline.phases"
    assert rooms["roll.pipeline.checks.config"] == "roll.pipeline.checks"
    assert rooms["roll.pipeline.agentic_pipeline"] == "roll.pipeline"
    files = import_graph.module_files(ROOT)
    for module, room in rooms.items():  # each folder of roll/pipeline is a room of its own
        folder = files[module].parent.relative_to(ROOT).as_posix().replace("/", ".")
        assert room == folder, module


def test_the_room_rule_sees_an_import_up_and_one_between_neighbours():
    graph = {
        "roll.agentic.agent_loop.base": {"roll.agentic.rollout.gateway", "roll.agentic.episode"},
        "roll.agentic.episode": {"roll.agentic.generation"},  # side by side: neither is below
        "roll.pipeline.warm_start": {"roll.cli", "roll.configs.command_line"},
        "roll.agentic.newroom.x": set(),
    }
    assert import_graph.upward_room_imports(graph) == [
        "roll.agentic.agent_loop.base (roll.agentic.agent_loop) -> roll.agentic.rollout.gateway (roll.agentic.rollout)",
        "roll.agentic.episode (roll.agentic.episode) -> roll.agentic.generation (roll.agentic.generation)",
        "roll.pipeline.warm_start (roll.pipeline) -> roll.cli (roll.cli)",
    ]
    assert import_graph.unplaced_modules(graph) == ["roll.agentic.newroom.x"]


def test_the_ground_floor_imports_nothing_above_it(graph):
    assert violations(graph, GROUND, allowed=GROUND) == []


def test_configs_import_only_the_ground_floor(graph):
    assert violations(graph, ("roll.configs",), allowed=("roll.configs", *GROUND)) == []


def test_algorithms_import_no_rollout_engines_or_pipeline(graph):
    assert violations(graph, ("roll.algorithms",), ("roll.agentic", "roll.distributed", "roll.pipeline")) == []


def test_algorithms_import_no_configs(graph):
    # shared vocabulary (the reward-normalisation table) lives on the ground floor
    assert violations(graph, ("roll.algorithms",), ("roll.configs",)) == []


def test_models_import_no_agentic(graph):
    assert violations(graph, ("roll.models",), ("roll.agentic", "roll.distributed", "roll.pipeline")) == []


def test_roll_never_imports_envs(graph):
    # built-in envs are found through the registry like a user's env
    assert violations(graph, ("roll",), ("envs",)) == []


def test_the_diagram_in_the_doc_is_up_to_date(graph):
    doc = import_graph.DOC.read_text(encoding="utf-8")
    expected = import_graph.doc_with_diagram(doc, import_graph.mermaid(graph))
    assert doc == expected, "run: python scripts/import_graph.py --write"
