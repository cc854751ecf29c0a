"""Draw a text grid (one character per cell, rows split by newlines) as an RGB image with pillow.

Grid envs (FrozenLake, Sokoban) use it for `render_mode="rgb_array"` and for the PNG / GIF frames
that `render_save_dir` writes, so a frame image is always a pure function of the frame text.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import numpy as np
from matplotlib import font_manager
from PIL import Image, ImageDraw, ImageFont

RGB = tuple[int, int, int]
UNKNOWN_FILL: RGB = (128, 128, 128)
_TEXT: RGB = (0, 0, 0)


@functools.cache
def grid_font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """DejaVu Sans (shipped with matplotlib, a dependency) at `size` px: unlike pillow's built-in
    font it has the grid symbols beyond ASCII (√). Pillow's font if it cannot be found."""
    try:
        return ImageFont.truetype(font_manager.findfont("DejaVu Sans", fallback_to_default=False), size)
    except (OSError, ValueError):
        return ImageFont.load_default(size=size)


def draw_grid(frame: str, palette: Mapping[str, RGB], cell_px: int = 32) -> np.ndarray:
    """The grid `frame` as a (rows * cell_px, cols * cell_px, 3) uint8 array.

    Each cell is filled with `palette[char]` (grey for a character not in it) and shows the
    character itself in the middle, so an image stays readable without a legend. Short rows are
    padded with unknown cells. A line holding a space is text beside the grid (an env's
    `show_neighbours` line), not a row of cells, and is left out.
    """
    if cell_px < 8:
        raise ValueError(f"cell_px must be >= 8, got {cell_px}")
    rows = [row for row in frame.split("\n") if " " not in row] or [""]
    width = max(1, max(len(row) for row in rows))
    image = Image.new("RGB", (width * cell_px, len(rows) * cell_px), UNKNOWN_FILL)
    draw = ImageDraw.Draw(image)
    font = grid_font(cell_px // 2)
    for r, row in enumerate(rows):
        for c, char in enumerate(row):
            box = (c * cell_px, r * cell_px, (c + 1) * cell_px - 1, (r + 1) * cell_px - 1)
            draw.rectangle(box, fill=palette.get(char, UNKNOWN_FILL), outline=(40, 40, 40))
            centre = (c * cell_px + cell_px / 2, r * cell_px + cell_px / 2)
            draw.text(centre, char, fill=_TEXT, font=font, anchor="mm")
    return np.asarray(image, dtype=np.uint8)
