"""The import structure of roll/ and envs/, read from the code with `ast` (nothing is imported).

    python scripts/import_graph.py            # print the floor-level Mermaid diagram
    python scripts/import_graph.py --write    # write it into docs/architecture.md
    python scripts/import_graph.py --cycles   # list file-level import cycles
    python scripts/import_graph.py --rooms    # list imports of a room at or above the importer's (ROOMS)

Every import counts: module level, inside functions, and type-only ones under `TYPE_CHECKING`.
An edge goes from a file to the file of the module it names (`from a.b import c` goes to `a/b/c.py`
when that is a module, else to `a/b.py` or `a/b/__init__.py`); the `__init__.py` files of parent
packages that Python also runs are not edges, so a package that re-exports its modules is no cycle.
`tests/test_architecture.py` checks the rules of docs/architecture.md on this graph.
`script_graph` is the same graph for the benchmark scripts (benchmarks/, a package of folders): which
script imports which (tests/benchmarks/test_imports.py: no cycle).
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("roll", "envs")
DOC = ROOT / "docs" / "architecture.md"
BEGIN, END = "<!-- import-graph:begin -->", "<!-- import-graph:end -->"

FLOORS = {
    # module prefix -> floor shown in the diagram (longest prefix wins)
    "roll.core": "core",
    "roll.utils": "core",
    "roll.configs": "configs",
    "roll.algorithms": "algorithms",
    "roll.models": "models",
    "roll.tracking": "tracking",
    "roll.agentic": "agentic",
    "roll.distributed": "distributed",
    "roll.pipeline": "pipeline",
    "roll.cli": "pipeline",
    "roll.console": "pipeline",
    "roll": "core",
    "envs": "envs",
}


def module_files(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the packages."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imported_names(tree: ast.AST, module: str, is_package: bool) -> list[str]:
    """Dotted names each import statement of `tree` may load (relative imports resolved)."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            names.append(source)
            names += [f"{source}.{alias.name}" for alias in node.names]
    return names


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """Module -> the modules of the packages (roll/ and envs/) it imports (anywhere in the file)."""
    files = module_files(root, packages)
    graph = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        targets = set()
        for name in _imported_names(tree, module, path.name == "__init__.py"):
            # `from a.b import c`: the module a.b.c if it exists, else a.b (the longest that is a file)
            while name and name not in files:
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def script_graph(folder: Path) -> dict[str, set[str]]:
    """Script -> the scripts it imports, for a package of scripts grouped in folders (benchmarks/):
    the package's `import_graph`, its modules named relative to it (`gpu.decode_lane`, `common`), the
    folders' `__init__.py` files left out."""
    prefix = folder.name + "."
    graph = import_graph(folder.parent, (folder.name,))
    paths = module_files(folder.parent, (folder.name,))
    scripts = {name for name, path in paths.items() if path.name != "__init__.py"}
    return {
        name.removeprefix(prefix): {t.removeprefix(prefix) for t in targets if t in scripts}
        for name, targets in graph.items()
        if name in scripts
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


RANKS = {
    "core": 0,
    "configs": 1,
    "algorithms": 2,
    "models": 2,
    "agentic": 3,
    "distributed": 3,
    "tracking": 4,
    "envs": 4,
    "pipeline": 5,
}
"""Height of each floor: a floor imports only floors below it (docs/architecture.md)."""


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """`a -> b` for every import of a floor at the same height or above (other than its own)."""
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            a, b = floor_of(module), floor_of(target)
            if a != b and RANKS[b] >= RANKS[a]:
                found.append(f"{module} ({a}) -> {target} ({b})")
    return found


ROOMS = {
    "agentic": (
        ("roll.agentic.env", "roll.agentic.sandbox"),
        ("roll.agentic.episode", "roll.agentic.generation", "roll.agentic.gateway", "roll.agentic.templates"),
        ("roll.agentic.agent_loop",),
        ("roll.agentic.proxy",),
        ("roll.agentic.env_manager",),
        ("roll.agentic.rollout",),
        ("roll.agentic.play",),
    ),
    "pipeline": (
        ("roll.pipeline.phases",),
        ("roll.pipeline.failures",),
        ("roll.pipeline.setup",),
        ("roll.pipeline.checks",),
        ("roll.pipeline",),
        ("roll.cli",),
        ("roll.console",),
    ),
}
"""The rooms of a floor, bottom up (docs/architecture.md): a room imports only rooms below it; the
rooms of one tuple stand side by side and do not import each other. A room is a module prefix; a
module belongs to the lowest room whose prefix it has (`roll.pipeline` holds what no lower room does)."""


def room_of(module: str) -> tuple[int, str] | None:
    """(height, room) of a module on a floor with rooms; None on other floors, or when no room
    of its floor holds it (`unplaced_modules`)."""
    for height, rooms in enumerate(ROOMS.get(floor_of(module), ())):
        for room in rooms:
            if module == room or module.startswith(room + "."):
                return height, room
    return None


def unplaced_modules(graph: dict[str, set[str]]) -> list[str]:
    """Modules of a floor with rooms that no room holds (a floor's own empty package excepted)."""
    floor_packages = {"roll." + floor for floor in ROOMS}
    return sorted(m for m in graph if floor_of(m) in ROOMS and room_of(m) is None and m not in floor_packages)


def upward_room_imports(graph: dict[str, set[str]]) -> list[str]:
    """`a -> b` for every import, inside one floor, of another room at the same height or above."""
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            a, b = room_of(module), room_of(target)
            if a and b and a[1] != b[1] and floor_of(module) == floor_of(target) and b[0] >= a[0]:
                found.append(f"{module} ({a[1]}) -> {target} ({b[1]})")
    return found


def floor_of(module: str) -> str:
    prefix = max((p for p in FLOORS if module == p or module.startswith(p + ".")), key=len)
    return FLOORS[prefix]


def floor_edges(graph: dict[str, set[str]]) -> dict[tuple[str, str], int]:
    """(importing floor, imported floor) -> number of file-level imports behind the arrow."""
    edges: dict[tuple[str, str], int] = {}
    for module, targets in graph.items():
        for target in targets:
            a, b = floor_of(module), floor_of(target)
            if a != b:
                edges[(a, b)] = edges.get((a, b), 0) + 1
    return edges


def mermaid(graph: dict[str, set[str]]) -> str:
    """A Mermaid flowchart of the floors, an arrow per imported floor labelled with its count."""
    lines = ["```mermaid", "flowchart TD"]
    for (a, b), n in sorted(floor_edges(graph).items()):
        lines.append(f"    {a} -->|{n}| {b}")
    lines.append("```")
    return "\n".join(lines)


def doc_with_diagram(text: str, diagram: str) -> str:
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{DOC}: no {BEGIN} ... {END} block to fill")
    return pattern.sub(lambda _: f"{BEGIN}\n{diagram}\n{END}", text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write the diagram into {DOC.name}")
    parser.add_argument("--cycles", action="store_true", help="list file-level import cycles")
    parser.add_argument("--rooms", action="store_true", help="list imports of a room at or above the importer's")
    args = parser.parse_args(argv)
    graph = import_graph()
    if args.cycles:
        for component in cycles(graph):
            print(" <-> ".join(component))
        return 0
    if args.rooms:
        for line in upward_room_imports(graph) + [f"{m} (no room)" for m in unplaced_modules(graph)]:
            print(line)
        return 0
    diagram = mermaid(graph)
    if args.write:
        DOC.write_text(doc_with_diagram(DOC.read_text(encoding="utf-8"), diagram), encoding="utf-8")
    else:
        print(diagram)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
