"""Optimal Sokoban plans by breadth-first search over (player, boxes) positions.

BFS counts every move (walks and pushes alike), so a plan is as short as possible in env steps,
which is what `min_moves` and the scripted agent need. It prunes positions with a box on a "dead"
cell (one from which no push sequence can bring a box to any target, e.g. a corner without a
target), which never removes a solution. The search stops after `max_states` positions, so it
cannot hang on a large room; rooms of the default sizes have a few hundred to a few thousand.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from envs.sokoban.room import DIRECTIONS, Cell, Room, step_cell

MAX_STATES = 200_000
Key = tuple[Cell, frozenset[Cell]]


def live_cells(room: Room) -> frozenset[Cell]:
    """The floor cells from which a lone box can be pushed onto some target (walls only, other
    boxes ignored): everything a box can be *pulled* to from a target, since a pull from `box`
    towards `delta` needs the two cells `box + delta` and `box + 2 * delta` to be floor."""
    live = set(room.targets)
    queue = deque(room.targets)
    while queue:
        box = queue.popleft()
        for delta in DIRECTIONS.values():
            dest = step_cell(box, delta)
            if dest not in live and room.is_floor(dest) and room.is_floor(step_cell(dest, delta)):
                live.add(dest)
                queue.append(dest)
    return frozenset(live)


def _plan(parents: dict[Key, tuple[Key, str] | None], key: Key) -> list[str]:
    moves = []
    link = parents[key]
    while link is not None:
        key, action = link
        moves.append(action)
        link = parents[key]
    return moves[::-1]


def solve_room(room: Room, max_states: int = MAX_STATES) -> list[str] | None:
    """The shortest list of actions (keys of `DIRECTIONS`) that solves `room`: [] when it is
    solved already, None when it cannot be solved or no plan was found within `max_states`
    distinct positions."""
    if room.is_solved:
        return []
    live = live_cells(room)
    if not room.boxes <= live:
        return None
    parents: dict[Key, tuple[Key, str] | None] = {(room.player, room.boxes): None}
    frontier = deque([room])
    while frontier:
        current = frontier.popleft()
        current_key = (current.player, current.boxes)
        for action in DIRECTIONS:
            nxt = current.push(action)
            key = (nxt.player, nxt.boxes)
            if key in parents or (nxt.boxes is not current.boxes and not nxt.boxes <= live):
                continue
            parents[key] = (current_key, action)
            if nxt.is_solved:
                return _plan(parents, key)
            if len(parents) >= max_states:
                return None
            frontier.append(nxt)
    return None


def solve(room_rows: Sequence[str], max_states: int = MAX_STATES) -> list[str] | None:
    """`solve_room` of the room drawn by `room_rows` in the default symbols (`# _ O X √ P S`)."""
    return solve_room(Room.parse(room_rows), max_states)
