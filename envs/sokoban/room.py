"""A Sokoban position (walls, targets, boxes, player) and its one rule: the player pushes.

`Room` is immutable and hashable, so the env, the generator and the solver share one move rule
(`Room.push`) and a solved/unsolved test, and the solver can key its search on rooms directly.
Cells are `(row, col)`; anything outside the grid counts as a wall, so a given room need not be
enclosed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

Cell = tuple[int, int]

# Action word -> (d_row, d_col), in the env's action order.
DIRECTIONS: dict[str, Cell] = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}
# Symbol name -> the character the text render uses (ROLL's / RAGEN's Sokoban symbols).
DEFAULT_SYMBOLS: dict[str, str] = {
    "wall": "#",
    "empty": "_",
    "target": "O",
    "box": "X",
    "box_on_target": "√",
    "player": "P",
    "player_on_target": "S",
}


def step_cell(cell: Cell, delta: Cell) -> Cell:
    """The neighbour of `cell` in direction `delta`."""
    return cell[0] + delta[0], cell[1] + delta[1]


def check_symbols(grid_vocab: Mapping[str, str] | None) -> dict[str, str]:
    """`DEFAULT_SYMBOLS` with `grid_vocab`'s overrides, rejected unless every name is known and
    the seven symbols are distinct single non-whitespace characters (a render must parse back)."""
    overrides = dict(grid_vocab or {})
    unknown = sorted(set(overrides) - set(DEFAULT_SYMBOLS))
    if unknown:
        raise ValueError(f"grid_vocab has unknown names {unknown}; known: {list(DEFAULT_SYMBOLS)}")
    symbols = {**DEFAULT_SYMBOLS, **overrides}
    for name, char in symbols.items():
        if not (isinstance(char, str) and len(char) == 1 and not char.isspace()):
            raise ValueError(f"grid_vocab[{name!r}] must be one non-space character, got {char!r}")
    if len(set(symbols.values())) != len(symbols):
        raise ValueError(f"grid_vocab symbols must be distinct, got {symbols}")
    return symbols


@dataclasses.dataclass(frozen=True)
class Room:
    """One Sokoban position on a `shape` = (rows, cols) grid."""

    shape: Cell
    walls: frozenset[Cell]
    targets: frozenset[Cell]
    boxes: frozenset[Cell]
    player: Cell

    @classmethod
    def parse(cls, rows: Sequence[str], symbols: Mapping[str, str] = DEFAULT_SYMBOLS) -> Room:
        """The room drawn by `rows` (one string per row, `symbols` as in `render`), rejected
        unless it is rectangular, uses only known symbols, has exactly one player, at least one
        box and as many boxes as targets."""
        rows = [str(row) for row in rows]
        if not rows or not rows[0] or len({len(row) for row in rows}) != 1:
            raise ValueError(f"room must be non-empty rows of equal length, got {rows}")
        names = {char: name for name, char in symbols.items()}
        cells: dict[str, set[Cell]] = {name: set() for name in symbols}
        for r, row in enumerate(rows):
            for c, char in enumerate(row):
                if char not in names:
                    raise ValueError(f"room has unknown symbol {char!r}; known: {list(names)}")
                cells[names[char]].add((r, c))
        players = cells["player"] | cells["player_on_target"]
        boxes = cells["box"] | cells["box_on_target"]
        targets = cells["target"] | cells["box_on_target"] | cells["player_on_target"]
        if len(players) != 1:
            raise ValueError(f"room needs exactly one player, got {len(players)}: {rows}")
        if not boxes or len(boxes) != len(targets):
            raise ValueError(f"room needs >= 1 box and as many targets as boxes: {rows}")
        shape = (len(rows), len(rows[0]))
        return cls(shape, frozenset(cells["wall"]), frozenset(targets), frozenset(boxes), players.pop())

    def render(self, symbols: Mapping[str, str] = DEFAULT_SYMBOLS) -> str:
        """The room as text, one row per line, no separators (`DEFAULT_SYMBOLS` for the legend)."""
        lines = []
        for r in range(self.shape[0]):
            lines.append("".join(symbols[self._cell_name((r, c))] for c in range(self.shape[1])))
        return "\n".join(lines)

    def neighbour_line(self, symbols: Mapping[str, str], actions: Sequence[str]) -> str:
        """For each action, the cell a move leads to and the one behind it (where a pushed box
        would go), e.g. `Up _ _ Down X O Left # # Right _ #`; off the grid reads as a wall."""
        parts = []
        for action in actions:
            (dr, dc), (r, c) = DIRECTIONS[action], self.player
            cells = [(r + dr, c + dc), (r + 2 * dr, c + 2 * dc)]
            names = [
                self._cell_name(x) if 0 <= x[0] < self.shape[0] and 0 <= x[1] < self.shape[1] else "wall" for x in cells
            ]
            parts.append(" ".join([action, *(symbols[n] for n in names)]))
        return " ".join(parts)

    def _cell_name(self, cell: Cell) -> str:
        on_target = cell in self.targets
        if cell == self.player:
            return "player_on_target" if on_target else "player"
        if cell in self.boxes:
            return "box_on_target" if on_target else "box"
        if cell in self.walls:
            return "wall"
        return "target" if on_target else "empty"

    def is_floor(self, cell: Cell) -> bool:
        """Inside the grid and not a wall (a box or the player may stand there)."""
        inside = 0 <= cell[0] < self.shape[0] and 0 <= cell[1] < self.shape[1]
        return inside and cell not in self.walls

    def is_open(self, cell: Cell) -> bool:
        """A floor cell without a box: a box or the player can move into it."""
        return self.is_floor(cell) and cell not in self.boxes

    @property
    def boxes_on_target(self) -> int:
        return len(self.boxes & self.targets)

    @property
    def is_solved(self) -> bool:
        return self.boxes == self.targets

    def push(self, action: str) -> Room:
        """The room after the player tries to move `action` (a key of `DIRECTIONS`): into an open
        cell it walks, into a box it pushes the box one cell if the cell behind it is open; a move
        into a wall or an immovable box returns `self` unchanged."""
        delta = DIRECTIONS[action]
        dest = step_cell(self.player, delta)
        if self.is_open(dest):
            return dataclasses.replace(self, player=dest)
        beyond = step_cell(dest, delta)
        if dest in self.boxes and self.is_open(beyond):
            boxes = (self.boxes - {dest}) | {beyond}
            return dataclasses.replace(self, boxes=boxes, player=dest)
        return self
