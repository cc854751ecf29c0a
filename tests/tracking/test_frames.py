"""Saved episode frames: the text file always, PNGs and an animated GIF for envs that draw."""

import re

import numpy as np
import pytest
from PIL import Image, ImageSequence

from envs.frozen_lake.env import FrozenLakeEnv
from roll.agentic.env import TextEnv
from roll.core.records import Trajectory
from roll.tracking.frames import file_stem, save_episode_frames

# The 3x3 "OPEN" map of test_frozen_lake: Down, then Right reaches the goal.
FRAMES = ["___\n_P_\n__G", "___\n___\n_PG", "___\n___\n__√"]
CAPTIONS = ["reset (seed 3)", "'Down' -> reward 0", "'Right' -> reward 1"]  # one line each


def trajectory(traj_id="val-0-0", frames=FRAMES, captions=CAPTIONS, success=True):
    return Trajectory(
        tag="FrozenLake",
        traj_group_id="val-0",
        traj_id=traj_id,
        env_seed=3,
        step_rewards=[0.0, 1.0],
        success=success,
        stop_reason="terminated",
        policy_version=2,
        num_actions=2,
        num_valid_actions=2,
        frames=list(frames),
        frame_captions=list(captions),
    )


class TextOnlyEnv(TextEnv):
    """A real env without images (`frame_to_rgb` returns None), like WebShop."""

    actions = ("go",)

    def _reset(self, options):
        return "page"

    def _apply(self, action):
        return "page", 0.0, False, False

    @property
    def success(self):
        return False


def test_frozen_lake_episode_writes_text_pngs_and_gif(tmp_path):
    paths = save_episode_frames(tmp_path / "step_2", trajectory(), FrozenLakeEnv)
    root = tmp_path / "step_2"
    pngs = [root / "val-0-0" / f"frame_00{i}.png" for i in range(3)]
    assert paths == [root / "val-0-0.txt", *pngs, root / "val-0-0.gif"]
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*.*")) == [
        "val-0-0.gif",
        "val-0-0.txt",
        "val-0-0/frame_000.png",
        "val-0-0/frame_001.png",
        "val-0-0/frame_002.png",
    ]
    assert (root / "val-0-0.txt").read_text() == (
        "# val-0-0 seed=3 reward=1.0 success=True\n\n"
        "reset (seed 3)\n___\n_P_\n__G\n\n"
        "'Down' -> reward 0\n___\n___\n_PG\n\n"
        "'Right' -> reward 1\n___\n___\n__√\n"
    )


def test_png_is_the_grid_centred_over_its_caption(tmp_path):
    save_episode_frames(tmp_path, trajectory(), FrozenLakeEnv)
    first = np.asarray(Image.open(tmp_path / "val-0-0" / "frame_000.png").convert("RGB"))
    # 3x3 cells of 32 px = 96 px, centred in the 256 px minimum width: x from 80 to 175;
    # below it a one-line caption band: 4 px padding, 15 px line, 4 px padding.
    assert first.shape == (96 + 4 + 15 + 4, 256, 3)
    grid = np.asarray(FrozenLakeEnv.frame_to_rgb(FRAMES[0]))
    assert np.array_equal(first[:96, 80:176], grid)
    assert (first[:96, :80] == 255).all() and (first[:96, 176:] == 255).all()  # white margins
    band = first[96:]
    assert (band < 128).any() and (band == 255).any()  # dark caption text on white
    second = np.asarray(Image.open(tmp_path / "val-0-0" / "frame_001.png").convert("RGB"))
    assert second.shape == first.shape and not np.array_equal(second[96:], band)


def test_gif_has_every_frame_at_two_fps_and_loops(tmp_path):
    save_episode_frames(tmp_path, trajectory(), FrozenLakeEnv)
    gif = Image.open(tmp_path / "val-0-0.gif")
    frames = list(ImageSequence.Iterator(gif))
    assert len(frames) == 3 and gif.info["loop"] == 0
    assert [f.info["duration"] for f in frames] == [500, 500, 500]
    assert gif.size == (256, 119)


def test_repeated_frames_stay_separate_gif_frames(tmp_path):
    """Invalid answers leave the frame unchanged; the step number in the caption keeps every
    GIF frame (pillow would merge identical ones)."""
    frames, captions = [FRAMES[0]] * 4, ["reset (seed 3)"] + ["'jump' -> reward -0.1"] * 3
    save_episode_frames(tmp_path, trajectory(frames=frames, captions=captions), FrozenLakeEnv)
    assert Image.open(tmp_path / "val-0-0.gif").n_frames == 4


def test_long_captions_wrap_and_every_image_has_one_size(tmp_path):
    captions = [CAPTIONS[0], repr("<answer>" + "very long answer " * 8), repr("x" * 2000)]
    paths = save_episode_frames(tmp_path, trajectory(captions=captions), FrozenLakeEnv)
    sizes = {Image.open(p).size for p in paths[1:]}
    assert sizes == {(256, 96 + 4 + 4 * 15 + 4)}  # at most 4 caption lines, the longest sets it


def test_env_without_images_writes_only_text(tmp_path):
    traj = trajectory(frames=["page one", "page two"], captions=["reset (seed 3)", "'go' -> 0"])
    paths = save_episode_frames(tmp_path, traj, TextOnlyEnv)
    assert paths == [tmp_path / "val-0-0.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["val-0-0.txt"]
    assert "reset (seed 3)\npage one\n\n'go' -> 0\npage two\n" in paths[0].read_text()


def test_episode_without_frames_writes_only_the_header(tmp_path):
    paths = save_episode_frames(tmp_path, trajectory(frames=[], captions=[], success=False), FrozenLakeEnv)
    assert paths == [tmp_path / "val-0-0.txt"]
    assert paths[0].read_text() == "# val-0-0 seed=3 reward=1.0 success=False\n\n\n"


@pytest.mark.parametrize("traj_id", ["val/0-0", "../up", "a b:c*?", "é-1", ".hidden", ""])
def test_unsafe_ids_become_safe_distinct_names_inside_the_directory(tmp_path, traj_id):
    paths = save_episode_frames(tmp_path, trajectory(traj_id=traj_id), FrozenLakeEnv)
    stem = file_stem(traj_id)
    assert re.fullmatch(r"([A-Za-z0-9_-][A-Za-z0-9._-]*-)?[0-9a-f]{8}", stem)
    assert paths[0] == tmp_path / f"{stem}.txt" and paths[-1] == tmp_path / f"{stem}.gif"
    assert all(p.resolve().is_relative_to(tmp_path.resolve()) for p in paths)
    assert paths[0].read_text().startswith(f"# {traj_id} seed=3")


def test_file_stem_keeps_safe_ids_and_separates_lookalikes():
    assert file_stem("val-12-3") == "val-12-3" and file_stem("train.1_a") == "train.1_a"
    assert file_stem("a/b") != file_stem("a_b") == "a_b"
    assert file_stem("a/b").startswith("a_b-") and file_stem("a b") != file_stem("a/b")
