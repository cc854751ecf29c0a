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
    assert "gpu.gpu_lane" in graph["gpu.decode_lane"]  # from benchmarks.gpu import gpu_lane
    assert "gpu.gpu_e2e_summary" in graph["gpu.gpu_e2e"]  # from benchmarks.gpu.gpu_e2e_summary import ...
    assert "environments.roll_protocol" in graph["environments.env_scale"]  # inside a function
    assert "common" in graph["environments.roll_protocol"]
    assert "gpu" not in graph and "gpu" not in graph["gpu.decode_lane"]  # a folder's __init__ is no script


def test_every_script_is_in_a_folder_but_common(graph):
    assert [name for name in graph if "." not in name] == ["common"]
    assert len(graph) > 40


def test_the_benchmark_scripts_import_each_other_without_a_cycle(graph):
    assert import_graph.cycles(graph) == []


def test_common_imports_no_other_script(graph):
    assert graph["common"] == set()


def test_a_cycle_between_two_scripts_in_different_folders_is_found(tmp_path):
    # env_scale.py and roll_protocol.py before benchmarks/common.py, moved apart
    root = tmp_path / "benchmarks"
    for folder in ("", "envs", "other"):
        (root / folder).mkdir(exist_ok=True)
        (root / folder / "__init__.py").write_text("")
    (root / "envs" / "env_scale.py").write_text("def main():\n    from benchmarks.other.roll_protocol import main\n")
    (root / "other" / "roll_protocol.py").write_text("from benchmarks.envs import env_scale\n")
    (root / "other" / "plain.py").write_text("import torch\nfrom roll.core import records\n")
    graph = import_graph.script_graph(root)
    assert graph["other.plain"] == set()
    assert import_graph.cycles(graph) == [["envs.env_scale", "other.roll_protocol"]]
