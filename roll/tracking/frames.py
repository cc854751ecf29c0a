"""Save the frames of an episode (`render_save_dir`): always the text, and for envs that can draw
their frames (`TextEnv.frame_to_rgb`) a PNG per frame and an animated GIF of the episode.

Images are drawn here from the saved frame text alone (the env class's classmethod), so the
rollout only ever ships strings and no env has to be alive to save its pictures. Each image shows
the frame with its caption (step number, the model's raw answer and the reward) underneath, so
the action that led to a frame is visible in the picture itself.
"""

from __future__ import annotations

import hashlib
import re
import textwrap
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from roll.agentic.env.base import TextEnv
from roll.agentic.env.grid_image import grid_font
from roll.core.records import Trajectory

GIF_FPS = 2
MIN_WIDTH_PX = 256  # a 4x4 grid is 128 px wide: too narrow for a readable caption
FONT_PX = 12
LINE_PX = 15
PAD_PX = 4
MAX_CAPTION_LINES = 4
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def file_stem(traj_id: str) -> str:
    """`traj_id` as a file name: characters outside `[A-Za-z0-9._-]` become `_` and leading dots
    go (no hidden files, no `..`); when that changed anything, 8 hex digits of the id's SHA-1 are
    appended so that two ids never share a file ("a/b" and "a_b" stay apart); an empty id is
    just those digits."""
    stem = _UNSAFE.sub("_", traj_id).lstrip(".")[:100]
    if stem and stem == traj_id:
        return stem
    digest = hashlib.sha1(traj_id.encode()).hexdigest()[:8]
    return f"{stem}-{digest}" if stem else digest


def episode_text(traj: Trajectory) -> str:
    """A header (id, seed, reward, success), then each caption followed by its frame."""
    header = f"# {traj.traj_id} seed={traj.env_seed} reward={traj.episode_reward} success={traj.success}\n\n"
    body = "\n\n".join(f"{cap}\n{frame}" for cap, frame in zip(traj.frame_captions, traj.frames))
    return header + body + "\n"


def _wrap(text: str, width_px: int, font: ImageFont.FreeTypeFont | ImageFont.ImageFont) -> list[str]:
    """`text` in lines of about `width_px` pixels (by the text's own mean glyph width), at most
    `MAX_CAPTION_LINES` of them."""
    mean_px = font.getlength(text) / max(1, len(text)) or 1.0
    chars = max(8, int(width_px / mean_px))  # textwrap needs room for the " ..." placeholder
    return textwrap.wrap(text, chars, max_lines=MAX_CAPTION_LINES, placeholder=" ...") or [""]


def _picture(env_cls: type[TextEnv], frame: str) -> Image.Image:
    rgb = env_cls.frame_to_rgb(frame)
    if rgb is None:
        raise ValueError(f"{env_cls.__name__} draws no image of the frame {frame!r}")
    return Image.fromarray(rgb)


def captioned_images(frames: list[str], captions: list[str], env_cls: type[TextEnv]) -> list[Image.Image]:
    """One RGB image per (frame, caption): the frame's picture centred on top, the caption
    ("step i: caption", wrapped, at most `MAX_CAPTION_LINES` lines) below. All images of an
    episode have one size, as a GIF needs."""
    grids = [_picture(env_cls, frame) for frame in frames]
    width = max(MIN_WIDTH_PX, *(grid.width for grid in grids))
    grid_height = max(grid.height for grid in grids)
    font = grid_font(FONT_PX)  # captions quote model text, which may be any unicode
    texts = [_wrap(f"step {i}: {caption}", width - 2 * PAD_PX, font) for i, caption in enumerate(captions)]
    height = grid_height + 2 * PAD_PX + LINE_PX * max(map(len, texts))
    images = []
    for grid, lines in zip(grids, texts):
        image = Image.new("RGB", (width, height), (255, 255, 255))
        image.paste(grid, ((width - grid.width) // 2, 0))
        draw = ImageDraw.Draw(image)
        for k, line in enumerate(lines):
            draw.text((PAD_PX, grid_height + PAD_PX + k * LINE_PX), line, fill=(0, 0, 0), font=font)
        images.append(image)
    return images


def save_episode_frames(directory: Path, traj: Trajectory, env_cls: type[TextEnv]) -> list[Path]:
    """Write `<stem>.txt` (`episode_text`) and, when `env_cls` draws frames, `<stem>/frame_000.png`,
    ... and the animated `<stem>.gif` (`GIF_FPS` frames a second, looping), where `<stem>` is
    `file_stem(traj.traj_id)`. Returns the written paths in that order."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    stem = file_stem(traj.traj_id)
    text_path = directory / f"{stem}.txt"
    text_path.write_text(episode_text(traj), encoding="utf-8")
    pairs = list(zip(traj.frames, traj.frame_captions))  # equal lengths, as the txt pairs them
    if not pairs or env_cls.frame_to_rgb(pairs[0][0]) is None:
        return [text_path]
    frames, captions = map(list, zip(*pairs))
    images = captioned_images(frames, captions, env_cls)
    (directory / stem).mkdir(exist_ok=True)
    png_paths = [directory / stem / f"frame_{i:03d}.png" for i in range(len(images))]
    for image, path in zip(images, png_paths):
        image.save(path)
    gif_path = directory / f"{stem}.gif"
    images[0].save(gif_path, save_all=True, append_images=images[1:], duration=1000 // GIF_FPS, loop=0)
    return [text_path, *png_paths, gif_path]
