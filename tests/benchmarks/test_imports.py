"""The benchmark scripts' imports of each other (scripts/import_graph.py's `script_graph`, read with
`ast`, nothing imported): no cycle, and benchmarks/common.py imports no other script."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("import_graph", REPO / "scripts" / "import_graph.py")
import_graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(import_graph)


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph.script_graph(REPO / "benchmarks")


def test_the_graph_sees_every_kind_of_script_import(graph):
    assert "gpu_lane" in graph["decode_lane"]  # from benchmarks import gpu_lane
    assert "gpu_e2e_summary" in graph["gpu_e2e"]  # from gpu_e2e_summary import ...
    assert "roll_protocol" in graph["env_scale"]  # inside a function
    assert "common" in graph["roll_protocol"]


def test_the_benchmark_scripts_import_each_other_without_a_cycle(graph):
    assert import_graph.cycles(graph) == []


def test_common_imports_no_other_script(graph):
    assert graph["common"] == set()


def test_a_cycle_between_two_scripts_is_found(tmp_path):
    # env_scale.py and roll_protocol.py before benchmarks/common.py
    (tmp_path / "env_scale.py").write_text("def main():\n    from roll_protocol import main\n")
    (tmp_path / "roll_protocol.py").write_text("from env_scale import Clock\n")
    (tmp_path / "other.py").write_text("import torch\nfrom roll.core import records\n")
    graph = import_graph.script_graph(tmp_path)
    assert graph["other"] == set()
    assert import_graph.cycles(graph) == [["env_scale", "roll_protocol"]]
