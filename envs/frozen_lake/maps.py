"""Random FrozenLake maps that are always solvable.

A map is a list of equal-length rows over gymnasium's letters: S start, F frozen, H hole, G goal.
Unlike gymnasium's `generate_random_map` (start and goal fixed in opposite corners), the start and
goal are placed by the rng, so a policy cannot solve every map with one memorised route, and
`max_path_length` bounds how far apart they may be (a curriculum knob for small models), and
`detour_prob` draws that share of maps from the *detour maps* alone: those whose shortest hole-free
path is longer than the Manhattan distance from S to G, so the walk must somewhere move away from
the goal (a training-set knob: with `hole_prob` 0.2 on 4x4 maps about 6% of maps are detours).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

# (row, col) offsets in gymnasium's action order: Left, Down, Right, Up.
MOVES: tuple[tuple[int, int], ...] = ((0, -1), (1, 0), (0, 1), (-1, 0))


def find_cell(desc: Sequence[str], letter: str) -> tuple[int, int]:
    """(row, col) of the first `letter` in `desc`."""
    for row, line in enumerate(desc):
        col = line.find(letter)
        if col >= 0:
            return row, col
    raise ValueError(f"map has no {letter!r}: {list(desc)}")


def goal_distances(desc: Sequence[str]) -> dict[tuple[int, int], int]:
    """Fewest moves from each cell to G that avoid holes, for every cell that can reach G.

    One breadth-first search backwards from the goal (moves are reversible), so both the path
    length from S and the scripted agent's next move (`next_move`) are lookups in its result."""
    goal = find_cell(desc, "G")
    rows, cols = len(desc), len(desc[0])
    distance = {goal: 0}
    queue = deque([goal])
    while queue:
        row, col = queue.popleft()
        for d_row, d_col in MOVES:
            nxt = (row + d_row, col + d_col)
            inside = 0 <= nxt[0] < rows and 0 <= nxt[1] < cols
            if inside and nxt not in distance and desc[nxt[0]][nxt[1]] != "H":
                distance[nxt] = distance[(row, col)] + 1
                queue.append(nxt)
    return distance


def shortest_path_length(desc: Sequence[str]) -> int | None:
    """Fewest moves from S to G that avoid holes, None if unreachable."""
    return goal_distances(desc).get(find_cell(desc, "S"))


def next_move(distances: dict[tuple[int, int], int], pos: tuple[int, int]) -> int | None:
    """Index into `MOVES` of the first move (in action order) from `pos` onto a cell one step
    nearer the goal, given `goal_distances`; None at the goal or where the goal is unreachable."""
    here = distances.get(pos)
    if not here:  # None (unreachable, or a hole) or 0 (on the goal)
        return None
    nearer = (
        index
        for index, (d_row, d_col) in enumerate(MOVES)
        if distances.get((pos[0] + d_row, pos[1] + d_col)) == here - 1
    )
    return next(nearer, None)


def needs_detour(desc: Sequence[str], distances: dict[tuple[int, int], int] | None = None) -> bool:
    """Whether the map's shortest hole-free path from S is longer than S's Manhattan distance to
    G: somewhere on it the walk must move away from the goal. `distances`: `goal_distances(desc)`
    if already computed. False when G is unreachable."""
    distances = goal_distances(desc) if distances is None else distances
    (start_row, start_col), (goal_row, goal_col) = find_cell(desc, "S"), find_cell(desc, "G")
    length = distances.get((start_row, start_col))
    return length is not None and length > abs(start_row - goal_row) + abs(start_col - goal_col)


MAX_SIZE = 64
"""Largest map side: 64 rows of 64 symbols is about 4,200 characters, inside an observation's 8,192."""


def check_map_params(size: int, hole_prob: float, max_path_length: int | None, detour_prob: float = 0.0) -> None:
    """Reject parameters for which `generate_map` would be meaningless, never return, or draw a
    map whose text exceeds an observation's limit (`MAX_SIZE`)."""
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
        raise ValueError(f"size must be an int, got {size!r}")
    if not 2 <= size <= MAX_SIZE:
        raise ValueError(
            f"size must be in [2, {MAX_SIZE}] (start and goal need two cells; the map is "
            f"text the model reads), got {size}"
        )
    if isinstance(hole_prob, bool) or not isinstance(hole_prob, (int, float)) or not 0.0 <= hole_prob <= 1.0:
        raise ValueError(f"hole_prob must be a number in [0, 1], got {hole_prob!r}")
    if max_path_length is not None and (
        isinstance(max_path_length, bool) or not isinstance(max_path_length, int) or max_path_length < 1
    ):
        raise ValueError(f"max_path_length must be an int >= 1 or None, got {max_path_length!r}")
    if isinstance(detour_prob, bool) or not isinstance(detour_prob, (int, float)) or not 0.0 <= detour_prob <= 1.0:
        raise ValueError(f"detour_prob must be a number in [0, 1], got {detour_prob!r}")
    # The smallest detour: S and G two cells apart on a 3x3 map, a hole between, a 4-move walk round.
    if detour_prob > 0 and (size < 3 or not 0 < hole_prob < 1 or (max_path_length or 4) < 4):
        raise ValueError(
            f"detour_prob > 0 needs maps that can need a detour: size >= 3, 0 < hole_prob < 1 and "
            f"max_path_length >= 4 or None; got size={size}, hole_prob={hole_prob}, "
            f"max_path_length={max_path_length}"
        )


def generate_map(
    rng: np.random.Generator,
    size: int,
    hole_prob: float,
    max_path_length: int | None = None,
    detour_prob: float = 0.0,
) -> list[str]:
    """A `size` x `size` map: each cell a hole with probability `hole_prob`, then start and goal
    on two distinct rng-chosen cells; redrawn until G is reachable from S in at most
    `max_path_length` moves (any number when None). Always terminates: adjacent S and G are
    accepted whatever the holes, and they come up with positive probability.

    With `detour_prob` > 0 one more draw first decides, with that probability, that the map must
    also `needs_detour` (redrawn until it does; `check_map_params` admits only shapes where
    detours occur). At 0 nothing more is drawn, so the maps are those of a run without the key."""
    check_map_params(size, hole_prob, max_path_length, detour_prob)
    want_detour = detour_prob > 0 and rng.random() < detour_prob
    while True:
        cells = np.where(rng.random((size, size)) < hole_prob, "H", "F")
        start, goal = rng.choice(size * size, size=2, replace=False)
        cells.flat[start], cells.flat[goal] = "S", "G"
        desc = ["".join(row) for row in cells]
        distances = goal_distances(desc)
        length = distances.get(find_cell(desc, "S"))
        if length is None or (max_path_length is not None and length > max_path_length):
            continue
        if not want_detour or needs_detour(desc, distances):
            return desc
