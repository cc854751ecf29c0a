"""Sokoban as a text env: push every box onto a target, in a room generated from the seed.

Rules and rewards follow gym-sokoban / ROLL: actions Up, Down, Left, Right; the player walks into
an open cell or pushes one box into an open cell, and anything else (a wall, a box against a wall
or another box) leaves the room unchanged. Rewards add up per move: -0.1 for the move, +1 for a
box pushed onto a target, -1 for a box pushed off one, +10 when every box is on a target (which
ends the episode). Differences: rooms come from `generator.generate_room` (one reverse walk, not
gym-sokoban's exhaustive search), the symbols can be changed with `grid_vocab`, and `max_steps`
cuts the episode (`truncated`) after that many parsed moves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from envs.sokoban.generator import check_room_params, generate_room
from envs.sokoban.room import DEFAULT_SYMBOLS, Room, check_symbols
from envs.sokoban.solver import solve_room
from roll.agentic.env import TextEnv
from roll.agentic.env.base import CHARSET, text_space
from roll.agentic.env.grid_image import draw_grid

STEP_REWARD = -0.1
BOX_ON_TARGET_REWARD = 1.0
SOLVED_REWARD = 10.0
# Default symbol -> fill colour of `frame_to_rgb`.
PALETTE = {
    "#": (60, 60, 70),  # wall: dark
    "_": (235, 230, 215),  # floor
    "O": (230, 120, 110),  # target: red-ish
    "X": (160, 110, 60),  # box: brown
    "√": (120, 190, 100),  # box on target: green
    "P": (90, 140, 230),  # player: blue
    "S": (150, 120, 220),  # player on target: violet
}


ROLL_CELL_CODES = {0: "wall", 1: "empty", 2: "target", 3: "box_on_target", 4: "box", 5: "player", 6: "player_on_target"}
"""ROLL's Sokoban cell codes (`grid_lookup` keys) -> our symbol names."""


def roll_grid_lookup(grid_lookup: Mapping[int, str]) -> dict[str, str]:
    """ROLL's `grid_lookup` (cell code -> symbol) as our `grid_vocab` (name -> symbol)."""
    unknown = sorted(set(map(int, grid_lookup)) - set(ROLL_CELL_CODES))
    if unknown:
        raise ValueError(f"grid_lookup has unknown cell codes {unknown}; known: {sorted(ROLL_CELL_CODES)}")
    return {ROLL_CELL_CODES[int(code)]: symbol for code, symbol in grid_lookup.items()}


def _instruction(symbols: Mapping[str, str]) -> str:
    s = symbols
    return (
        f"You are the player {s['player']} in a Sokoban puzzle. Push every box {s['box']} onto a "
        f"target {s['target']}. You can push a box but not pull it, and a box against a wall or "
        f"another box does not move. Symbols: {s['wall']} wall, {s['empty']} floor, "
        f"{s['target']} target, {s['box']} box, {s['box_on_target']} box on target, "
        f"{s['player']} player, {s['player_on_target']} player on target. "
        "Answer with one move, like <answer>Up</answer>: Up, Down, Left or Right."
    )


def _check_dim_room(dim_room: Sequence[int]) -> tuple[int, int]:
    if not (
        isinstance(dim_room, (tuple, list))
        and len(dim_room) == 2
        and all(isinstance(d, int) and not isinstance(d, bool) for d in dim_room)
    ):
        raise ValueError(f"dim_room must be a tuple or list of 2 ints, got {dim_room!r}")
    return int(dim_room[0]), int(dim_room[1])


class SokobanEnv(TextEnv):
    """Push every box onto a target; see the module docstring for rules and rewards.

    `search_depth` (reverse moves from the solved room) is the difficulty knob: at 6 x 6 with one
    box, 10 gives rooms of 1-8 moves (mean 2.8), 30 of 1-12 (mean 4.1).
    `reset(options={"room": [...]})` plays the given rows (in this env's symbols) instead, if they
    are solvable. `episode_metrics`: `boxes_on_target`, `num_boxes` and `min_moves` (the optimal
    solution length from the start).
    `scripted_action` plays an optimal plan (`solver.solve_room`) from the current room.
    `show_neighbours=True` adds a line after the room: for each action, the cell a move leads to
    and the one behind it (`Room.neighbour_line`), facts of the grid put next to the action words.
    """

    metadata = {"render_modes": ["ansi", "rgb_array"], "render_fps": 4}
    actions = ("Up", "Down", "Left", "Right")
    # A move is tens of microseconds: stepped inline. A reset generates a room by search, which
    # grows fast with the room and search_depth, so it stays on a thread.
    cheap_calls = frozenset({"step"})
    instruction = _instruction(DEFAULT_SYMBOLS)

    def __init__(
        self,
        dim_room: Sequence[int] = (6, 6),
        num_boxes: int = 1,
        search_depth: int = 30,
        max_steps: int = 100,
        grid_vocab: Mapping[str, str] | None = None,
        format_penalty: float = -0.1,
        render_mode: str | None = None,
        action_pattern: str | None = None,
        env_instruction: str | None = None,
        grid_lookup: Mapping[int, str] | None = None,
        show_neighbours: bool = False,
    ) -> None:
        super().__init__(
            format_penalty=format_penalty,
            render_mode=render_mode,
            action_pattern=action_pattern,
            env_instruction=env_instruction,
        )
        if grid_lookup is not None:  # ROLL's form: cell code -> symbol; its grid_vocab describes symbols
            grid_vocab = roll_grid_lookup(grid_lookup)
        self.dim_room = _check_dim_room(dim_room)
        check_room_params(self.dim_room, num_boxes, search_depth)
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.num_boxes = num_boxes
        self.search_depth = search_depth
        self.max_steps = max_steps
        self.show_neighbours = show_neighbours
        self.symbols = check_symbols(grid_vocab)
        self.instruction = _instruction(self.symbols)
        extra = "".join(sorted(set(self.symbols.values()) - set(CHARSET)))
        if extra:  # custom symbols outside the base charset must still be valid observations
            self.observation_space = text_space(charset=CHARSET + extra)
        self._room: Room | None = None
        self._moves = 0
        self._min_moves = 0
        self._plans: dict[Room, str | None] = {}  # room -> next move of an optimal plan

    @property
    def success(self) -> bool:
        return self._room is not None and self._room.is_solved

    @property
    def _current(self) -> Room:
        """The room being played: set by every reset, and TextEnv.step refuses a step before one."""
        assert self._room is not None, "reset() first"
        return self._room

    def episode_metrics(self) -> dict[str, float]:
        room = self._current
        return {
            "boxes_on_target": float(room.boxes_on_target),
            "num_boxes": float(len(room.boxes)),
            "min_moves": float(self._min_moves),
        }

    def _reset(self, options: dict[str, Any]) -> str:
        self._plans = {}
        if "room" in options:
            room = Room.parse(options["room"], self.symbols)
            plan = solve_room(room)
            if plan is None:
                raise ValueError(f"room has no solution: {list(options['room'])}")
        else:
            room, plan = generate_room(self.np_random, self.dim_room, self.num_boxes, self.search_depth)
        self._remember(room, plan)
        self._room, self._moves, self._min_moves = room, 0, len(plan)
        return self._observe(room)

    def _apply(self, action: str) -> tuple[str, float, bool, bool]:
        before = self._current
        if before.is_solved:  # the episode is over: absorbing, as in FrozenLake
            return self._observe(before), 0.0, True, False
        self._moves += 1
        self._room = after = before.push(action)
        on_target_change = after.boxes_on_target - before.boxes_on_target
        reward = STEP_REWARD + BOX_ON_TARGET_REWARD * on_target_change
        if after.is_solved:
            reward += SOLVED_REWARD
        truncated = not after.is_solved and self._moves >= self.max_steps
        return self._observe(after), reward, after.is_solved, truncated

    def _observe(self, room: Room) -> str:
        text = room.render(self.symbols)
        return f"{text}\n{room.neighbour_line(self.symbols, self.actions)}" if self.show_neighbours else text

    def _remember(self, room: Room, plan: list[str] | None) -> None:
        """Cache the next move of `plan` for every room along it (None: no plan from `room`)."""
        if plan is None:
            self._plans[room] = None
        for action in plan or ():
            self._plans[room] = action
            room = room.push(action)

    def scripted_action(self) -> str | None:
        """`<answer>Move</answer>` for the next move of an optimal plan from the current room,
        None when it is solved or cannot be solved. Re-plans only after leaving the cached plan."""
        if self._room is None or self._room.is_solved:
            return None
        if self._room not in self._plans:
            self._remember(self._room, solve_room(self._room))
        action = self._plans[self._room]
        return None if action is None else f"<answer>{action}</answer>"

    @classmethod
    def frame_to_rgb(cls, frame: str) -> np.ndarray:
        """The (rows * 32, cols * 32, 3) uint8 image of `frame`. Colours follow the default
        symbols (a classmethod cannot know an instance's `grid_vocab`): other characters are
        grey cells that still show the character."""
        return draw_grid(frame, PALETTE)
