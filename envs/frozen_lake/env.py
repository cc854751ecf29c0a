"""FrozenLake as a text env (gymnasium's toy-text FrozenLake, drawn as a grid of symbols).

Same dynamics as `gymnasium.envs.toy_text.FrozenLakeEnv`: actions Left, Down, Right, Up; a move
into the edge leaves the player in place; on slippery ice the player goes the intended way or
one of the two perpendicular ways, 1/3 each; reward 1 on the goal, else 0; a hole or the goal
ends the episode. Differences: maps are random per episode with rng-placed start and goal
(`maps.generate_map`), and observations are text (`_` ice, `O` hole, `G` goal, `P` player,
`X` player in a hole, `√` player on the goal; the start cell is ice once the player leaves it).
`scripted_action` walks a shortest path round the holes (optimal on non-slippery ice; on slippery
ice it still aims along a shortest path, which is not the best policy there) and `frame_to_rgb`
draws a frame as coloured cells, so `render_mode="rgb_array"` and saved GIFs come for free.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from envs.frozen_lake.maps import (
    MOVES,
    check_map_params,
    find_cell,
    generate_map,
    goal_distances,
    needs_detour,
    next_move,
    shortest_path_length,
)
from roll.agentic.env import TextEnv
from roll.agentic.env.grid_image import RGB, draw_grid

_SYMBOL = {"S": "_", "F": "_", "H": "O", "G": "G"}
_PLAYER_ON = {"S": "P", "F": "P", "H": "X", "G": "√"}
# Frame symbol -> cell colour: light-blue ice, dark-blue holes, green goal, the player in red
# (dark red in a hole, gold once on the goal).
PALETTE: dict[str, RGB] = {
    "_": (200, 230, 250),
    "O": (40, 70, 150),
    "G": (60, 180, 75),
    "P": (220, 50, 50),
    "X": (120, 20, 40),
    "√": (255, 200, 0),
}


def observation_text(
    desc: Sequence[str],
    pos: tuple[int, int],
    show_neighbours: bool = False,
    actions: Sequence[str] = ("Left", "Down", "Right", "Up"),
) -> str:
    """What the player at `pos` on map `desc` (rows of S/F/H/G) sees: the grid of symbols, and with
    `show_neighbours` a last line naming the cell each action leads to (`#`: off the map)."""
    rows = []
    for row, line in enumerate(desc):
        symbols = [_SYMBOL[letter] for letter in line]
        if row == pos[0]:
            symbols[pos[1]] = _PLAYER_ON[line[pos[1]]]
        rows.append("".join(symbols))
    if show_neighbours:
        cells = []
        for move, name in enumerate(actions):
            row, col = pos[0] + MOVES[move][0], pos[1] + MOVES[move][1]
            inside = 0 <= row < len(desc) and 0 <= col < len(desc[0])
            cells.append(f"{name} {_SYMBOL[desc[row][col]] if inside else '#'}")
        rows.append(" ".join(cells))
    return "\n".join(rows)


def _check_desc(desc: Sequence[str]) -> list[str]:
    """A given map as a list of rows, rejected unless it is a playable FrozenLake map."""
    rows = [str(row) for row in desc]
    text = "".join(rows)
    if not rows or len({len(row) for row in rows}) != 1 or not set(text) <= set("SFHG"):
        raise ValueError(f"desc must be equal-length rows of S, F, H, G; got {rows}")
    if text.count("S") != 1 or text.count("G") != 1:
        raise ValueError(f"desc needs exactly one S and one G; got {rows}")
    if shortest_path_length(rows) is None:
        raise ValueError(f"desc has no path from S to G: {rows}")
    return rows


class FrozenLakeEnv(TextEnv):
    """Walk from the start to the goal G without stepping into a hole O.

    `reset(options={"desc": [...]})` plays the given map (rows of S/F/H/G) instead of a random one.
    `episode_metrics`: `fell_in_hole` (0/1), `shortest_path` (fewest moves from the start),
    `detour_map` (0/1: the map `needs_detour`) and `detour_solved` (0/1: a detour map, solved), so
    a run's success on detour maps is `detour_solved / detour_map`. `detour_prob` (training maps)
    draws that share of maps from the detour maps alone (`maps.generate_map`).
    `show_neighbours=True` adds a line after the grid naming the cell each move leads to, e.g.
    `Left _ Down O Right G Up #` (`#`: the edge, the player stays): the same facts as the grid,
    where a small model reads them without locating the cell above or below the player (five
    tokens away in the flattened grid).
    """

    metadata = {"render_modes": ["ansi", "rgb_array"], "render_fps": 4}

    actions = ("Left", "Down", "Right", "Up")
    cheap_calls = frozenset({"reset", "step"})  # tens of microseconds, no I/O: stepped inline
    instruction = (
        "You are P on a frozen lake. Reach the goal G. Do not step into a hole O. "
        "Answer with one move, like <answer>Left</answer>: Left, Down, Right or Up."
    )

    def __init__(
        self,
        size: int = 4,
        hole_prob: float = 0.2,
        is_slippery: bool = False,
        max_path_length: int | None = None,
        format_penalty: float = -0.1,
        render_mode: str | None = None,
        action_pattern: str | None = None,
        env_instruction: str | None = None,
        max_steps: int | None = None,
        show_neighbours: bool = False,
        detour_prob: float = 0.0,
    ) -> None:
        super().__init__(
            format_penalty=format_penalty,
            render_mode=render_mode,
            action_pattern=action_pattern,
            env_instruction=env_instruction,
        )
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.max_steps = max_steps  # ROLL's key: truncate after this many actions (None: never)
        check_map_params(size, hole_prob, max_path_length, detour_prob)
        self.size = size
        self.detour_prob = detour_prob
        self.hole_prob = hole_prob
        self.is_slippery = is_slippery
        self.max_path_length = max_path_length
        self.show_neighbours = show_neighbours
        self._desc: list[str] = []
        self._pos = (0, 0)
        self._to_goal: dict[tuple[int, int], int] = {}  # goal_distances of the current map
        self._shortest_path = 0
        self._detour_map = False

    @property
    def _cell(self) -> str:
        return self._desc[self._pos[0]][self._pos[1]]

    @property
    def success(self) -> bool:
        return bool(self._desc) and self._cell == "G"

    def episode_metrics(self) -> dict[str, float]:
        return {
            "fell_in_hole": float(self._cell == "H"),
            "shortest_path": float(self._shortest_path),
            "detour_map": float(self._detour_map),
            "detour_solved": float(self._detour_map and self.success),
        }

    def _reset(self, options: dict[str, Any]) -> str:
        if "desc" in options:
            self._desc = _check_desc(options["desc"])
        else:
            self._desc = generate_map(self.np_random, self.size, self.hole_prob, self.max_path_length, self.detour_prob)
        self._pos = find_cell(self._desc, "S")
        self._to_goal = goal_distances(self._desc)
        self._shortest_path = self._to_goal[self._pos]
        self._detour_map = needs_detour(self._desc, self._to_goal)
        return self._text()

    def scripted_action(self) -> str | None:
        """The next move of a shortest path to the goal that avoids holes, as
        `<answer>Left</answer>`; None before a reset, on a hole or on the goal."""
        move = next_move(self._to_goal, self._pos)
        return None if move is None else f"<answer>{self.actions[move]}</answer>"

    @classmethod
    def frame_to_rgb(cls, frame: str) -> np.ndarray:
        """The frame as a grid of coloured 32-pixel cells (see `PALETTE`)."""
        return draw_grid(frame, PALETTE)

    def _apply(self, action: str) -> tuple[str, float, bool, bool]:
        if self._cell in "HG":  # the episode is over: absorbing, as in gymnasium
            return self._text(), 0.0, True, False
        direction = self.actions.index(action)
        if self.is_slippery:
            direction = (direction - 1 + int(self.np_random.integers(3))) % 4
        row, col = self._pos[0] + MOVES[direction][0], self._pos[1] + MOVES[direction][1]
        if 0 <= row < len(self._desc) and 0 <= col < len(self._desc[0]):
            self._pos = (row, col)
        truncated = self.max_steps is not None and self._num_actions >= self.max_steps
        return self._text(), float(self._cell == "G"), self._cell in "HG", truncated

    def _text(self) -> str:
        return observation_text(self._desc, self._pos, self.show_neighbours, self.actions)
