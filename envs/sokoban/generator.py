"""Random Sokoban rooms that are solvable by construction: reverse play from a solved position.

The idea of gym-sokoban (Schrader 2018, after Taylor & Parberry 2011), in our own simpler form:
1. carve a room topology inside walls with a random walk (`carve_floor`);
2. put the boxes on their targets and the player on another floor cell (a solved position);
3. play backwards for `search_depth` moves: the player walks to a random open neighbour and
   *pulls* a box that stands right behind it along. Every pull undoes a legal push, so every
   position on the way can be pushed back to the solved one;
4. keep the position with the largest total box displacement (sum of Manhattan distances of the
   boxes from the targets they started on) that is not solved; the latest wins ties, so the
   player has usually walked away from the box it pulled last (not one push from the end).
Differences from gym-sokoban: one random reverse walk instead of an exhaustive depth-first search
(so `search_depth` bounds the difficulty without costing exponential time), and a score without
the box-swap factor. A topology with too few floor cells, or a walk that never leaves a solved
position, is redrawn from the same rng stream, so the room is a function of the rng state.
"""

from __future__ import annotations

import numpy as np

from envs.sokoban.room import DIRECTIONS, Cell, Room, step_cell
from envs.sokoban.solver import MAX_STATES, solve_room

_DELTAS = tuple(DIRECTIONS.values())
# Chance per step that the carving walk turns to a new random direction.
_TURN_PROB = 0.35
# Cells carved around the walker at each step: one cell, or it and a right / lower neighbour.
_BRUSHES: tuple[tuple[Cell, ...], ...] = (((0, 0),), ((0, 0), (0, 1)), ((0, 0), (1, 0)))
MAX_ATTEMPTS = 1000


MAX_ROOM_SIDE = 30
MAX_SEARCH_DEPTH = 1000


def check_room_params(dim_room: tuple[int, int], num_boxes: int, search_depth: int) -> None:
    """Reject parameters for which `generate_room` could never succeed."""
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in (num_boxes, search_depth)):
        raise ValueError(f"num_boxes and search_depth must be ints, got {num_boxes!r}, {search_depth!r}")
    rows, cols = dim_room
    if rows < 3 or cols < 3 or max(rows, cols) < 5:
        raise ValueError(f"dim_room must be >= 3 x 3 with a side >= 5, got {dim_room}")
    if max(rows, cols) > MAX_ROOM_SIDE:
        raise ValueError(
            f"dim_room sides must be at most {MAX_ROOM_SIDE} (room generation and the "
            f"solver grow with the room), got {dim_room}"
        )
    if not 1 <= num_boxes <= (rows - 2) * (cols - 2) - 2:
        raise ValueError(f"num_boxes must be in [1, inner cells - 2], got {num_boxes}")
    if not 1 <= search_depth <= MAX_SEARCH_DEPTH:
        raise ValueError(f"search_depth must be in [1, {MAX_SEARCH_DEPTH}], got {search_depth}")


def carve_floor(rng: np.random.Generator, dim_room: tuple[int, int]) -> list[Cell]:
    """Floor cells (sorted) of a random topology: a walk of `2.5 * (rows + cols)` steps over the
    inner cells (the border stays wall) that carves a small brush at each cell it visits."""
    rows, cols = dim_room
    floor: set[Cell] = set()
    cell = (int(rng.integers(1, rows - 1)), int(rng.integers(1, cols - 1)))
    delta = _DELTAS[int(rng.integers(4))]
    for _ in range(int(2.5 * (rows + cols))):
        if rng.random() < _TURN_PROB:
            delta = _DELTAS[int(rng.integers(4))]
        for offset in _BRUSHES[int(rng.integers(len(_BRUSHES)))]:
            r, c = step_cell(cell, offset)
            if 1 <= r < rows - 1 and 1 <= c < cols - 1:
                floor.add((r, c))
        nxt = step_cell(cell, delta)
        cell = (min(max(nxt[0], 1), rows - 2), min(max(nxt[1], 1), cols - 2))
    return sorted(floor)


def _solved_room(rng: np.random.Generator, dim_room: tuple[int, int], floor: list[Cell], num_boxes: int) -> Room:
    """Boxes on `num_boxes` distinct rng-chosen targets, the player on another floor cell."""
    chosen = rng.choice(len(floor), size=num_boxes + 1, replace=False)
    targets = frozenset(floor[i] for i in chosen[:num_boxes])
    open_cells = set(floor)
    walls = frozenset((r, c) for r in range(dim_room[0]) for c in range(dim_room[1]) if (r, c) not in open_cells)
    return Room((dim_room[0], dim_room[1]), walls, targets, targets, floor[chosen[-1]])


def reverse_play(rng: np.random.Generator, solved: Room, search_depth: int) -> Room | None:
    """The most displaced unsolved position met in `search_depth` random reverse moves from
    `solved` (see the module docstring), or None if every position met was solved."""
    origin = {box: box for box in solved.boxes}  # where each box is now -> its own target
    room, best, best_score = solved, None, 0
    for _ in range(search_depth):
        moves = [d for d in _DELTAS if room.is_open(step_cell(room.player, d))]
        if not moves:
            break
        delta = moves[int(rng.integers(len(moves)))]
        dest, behind = step_cell(room.player, delta), step_cell(room.player, (-delta[0], -delta[1]))
        boxes = room.boxes
        if behind in boxes:
            boxes = (boxes - {behind}) | {room.player}
            origin[room.player] = origin.pop(behind)
        room = Room(room.shape, room.walls, room.targets, boxes, dest)
        score = sum(abs(b[0] - t[0]) + abs(b[1] - t[1]) for b, t in origin.items())
        if score > 0 and score >= best_score and not room.is_solved:
            best, best_score = room, score
    return best


def generate_room(
    rng: np.random.Generator, dim_room: tuple[int, int], num_boxes: int, search_depth: int
) -> tuple[Room, list[str]]:
    """A random unsolved room and its optimal plan (`solve_room`), drawn from `rng` alone.

    A candidate is redrawn when its topology has fewer floor cells than half the inner cells (a
    one-corridor room is a poor puzzle) or than `num_boxes + 2`, when reverse play never leaves a
    solved position, or (only for rooms far above the default size) when the solver gives up at
    `MAX_STATES`, so that `min_moves` is always exact. Raises RuntimeError after `MAX_ATTEMPTS`
    candidates (only for boxes that nearly fill the room).
    """
    check_room_params(dim_room, num_boxes, search_depth)
    min_floor = max(num_boxes + 2, (dim_room[0] - 2) * (dim_room[1] - 2) // 2)
    for _ in range(MAX_ATTEMPTS):
        floor = carve_floor(rng, dim_room)
        if len(floor) < min_floor:
            continue
        room = reverse_play(rng, _solved_room(rng, dim_room, floor, num_boxes), search_depth)
        if room is None:
            continue
        plan = solve_room(room, MAX_STATES)
        if plan:
            return room, plan
    raise RuntimeError(f"no room for dim_room={dim_room}, num_boxes={num_boxes} in {MAX_ATTEMPTS} attempts")
