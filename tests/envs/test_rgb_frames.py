"""`render_mode="rgb_array"` of the grid envs: every cell of the image is the cell of its grid
character (the palette colour with the glyph drawn on it), and equal seeds give equal images."""

from __future__ import annotations

import numpy as np
import pytest

from envs.frozen_lake.env import PALETTE as LAKE_PALETTE
from envs.frozen_lake.env import FrozenLakeEnv
from envs.sokoban.env import PALETTE as SOKOBAN_PALETTE
from envs.sokoban.env import SokobanEnv
from roll.agentic.env.grid_image import draw_grid

CELL = 32
ENVS = [
    (FrozenLakeEnv, {"size": 4, "hole_prob": 0.3}, LAKE_PALETTE),
    (SokobanEnv, {"dim_room": [6, 6], "num_boxes": 1, "search_depth": 10}, SOKOBAN_PALETTE),
]


def _cells(frame: str) -> list[list[str]]:
    return [list(row) for row in frame.split("\n") if " " not in row]


@pytest.mark.parametrize(("env_cls", "config", "palette"), ENVS)
@pytest.mark.parametrize("seed", [0, 3, 11])
def test_each_cell_shows_its_grid_character(env_cls, config, palette, seed):
    env = env_cls(render_mode="rgb_array", **config)
    obs, _ = env.reset(seed=seed)
    image = env.render()
    grid = _cells(obs)
    assert image.dtype == np.uint8 and image.shape == (len(grid) * CELL, len(grid[0]) * CELL, 3)
    for r, row in enumerate(grid):
        for c, char in enumerate(row):
            block = image[r * CELL : (r + 1) * CELL, c * CELL : (c + 1) * CELL]
            assert np.array_equal(block, draw_grid(char, palette)), (r, c, char)
            assert tuple(block[2, 2]) == palette[char]  # the fill, away from outline and glyph


@pytest.mark.parametrize(("env_cls", "config", "palette"), ENVS)
def test_equal_seeds_give_equal_images_after_the_same_actions(env_cls, config, palette):
    def play(seed: int) -> list[np.ndarray]:
        env = env_cls(render_mode="rgb_array", **config)
        env.reset(seed=seed)
        frames = [env.render()]
        for action in ("Up", "Left", "Down", "Right"):
            env.step(f"<answer>{action}</answer>")
            frames.append(env.render())
        return frames

    first, again, other = play(5), play(5), play(6)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not np.array_equal(first[0], other[0])
