"""The VL FrozenLake example shows the lake only as images: every prompt the engine gets, built by
the example's own config and the tiny VL model's processor, holds no grid text (no cell symbol and
no map row among its ids), one image per turn, and each image is the env's frame of that turn."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

import envs  # noqa: F401  registers the built-ins
from roll.agentic.env.registry import make_env
from roll.agentic.env_manager.vl_traj_env_manager import VLTrajEnvManager
from roll.agentic.episode import EpisodeSpec
from roll.configs.loader import load_config
from roll.core.records import SamplingParams
from roll.models.loading import load_processor
from roll.pipeline.setup.rollout_builders import env_spec
from roll.pipeline.tiny_model import main as build_model
from tests.conftest import vl_engine

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "vl_frozen_lake"


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory):
    return build_model(["--preset", "vl_frozen_lake", "--output_dir", str(tmp_path_factory.mktemp("m") / "vl")])


@pytest.fixture(scope="module")
def example(vl_dir):
    """The example's train tag as its env managers get it, the processor and an `hf` engine."""
    cfg = load_config(str(EXAMPLE), "agentic_val_vl_frozen_lake", [f"pretrain={vl_dir}"])
    (tag,) = cfg.train_env_manager.tags
    return cfg, env_spec(cfg, tag, cfg.train_env_manager), load_processor(vl_dir), vl_engine(vl_dir)


def play(example, env_seed: int) -> tuple[VLTrajEnvManager, list, list[np.ndarray]]:
    """One sampled episode: the manager, the requests it sent and the env's frame before each."""
    cfg, spec, processor, engine = example
    sent, frames = [], []

    async def generate(request):
        sent.append(request)
        frames.append(vl.env.render())
        return engine.generate_batch([request])[0]

    sampling = SamplingParams(max_new_tokens=spec.max_tokens_per_step, temperature=1.0)
    vl = VLTrajEnvManager(
        spec, processor, generate, sampling, cfg.sequence_length, max_images_per_prompt=spec.max_images_per_prompt
    )
    asyncio.run(vl.run_episode(EpisodeSpec("g", "g-0", env_seed=env_seed, sample_seed=1)))
    return vl, sent, frames


@pytest.mark.parametrize("env_seed", [3, 11])
def test_the_prompt_holds_no_grid_text_only_frames(example, env_seed):
    vl, sent, frames = play(example, env_seed)
    tok = vl.processor.tokenizer
    # what a text manager would show: the env's text observation, e.g. "O___\nP__O\n_O_G\n____"
    grid_text = make_env(vl.spec.env_type, {**vl.spec.env_config, "render_mode": None}).reset(seed=env_seed)[0]
    symbols = set(grid_text) - {"\n"}
    symbol_ids = {tok.convert_tokens_to_ids(s) for s in symbols}
    assert tok.unk_token_id not in symbol_ids and len(symbol_ids) == len(symbols) >= 3  # whole tokens
    assert len(sent) >= 2  # later turns (continuations) are checked too
    for turn, request in enumerate(sent, start=1):
        assert not symbol_ids & set(request.prompt_ids)  # not one cell of the grid as text
        assert len(request.images.image_grid_thw) == turn  # one image a turn, the prompt's images so far
    # each turn's image is the frame the env showed at that turn (a new frame after every move)
    pixels = vl.processor.image_processor(images=frames, return_tensors="pt")["pixel_values"]
    np.testing.assert_array_equal(sent[-1].images.pixel_values.numpy(), pixels.numpy())
