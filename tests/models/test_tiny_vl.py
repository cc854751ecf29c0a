"""The tiny Qwen2.5-VL: built by the CLI preset, loaded by the same code path as a real
Qwen2.5-VL dir (`AutoModelForImageTextToText`, the model's own processor), an image+text chat
processed into image placeholders, `pixel_values` and `image_grid_thw`, a forward and a generate."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor

import envs  # noqa: F401  registers the built-ins
from envs.sokoban.env import SokobanEnv
from roll.models.loading import is_vl_model, load_causal_lm, load_policy, load_processor
from roll.models.tiny import build_tiny_model
from roll.models.tiny_vl import IMAGE_PAD, MERGE_SIZE, VISION_END, VISION_START
from roll.pipeline.tiny_model import main


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory):
    return main(["--preset", "vl_sokoban", "--output_dir", str(tmp_path_factory.mktemp("m") / "vl")])


@pytest.fixture(scope="module")
def frame():
    env = SokobanEnv(render_mode="rgb_array", dim_room=[6, 6], num_boxes=1, search_depth=10)
    obs, _ = env.reset(seed=0)
    return obs, env.render()


def test_the_dir_is_a_qwen2_5_vl_checkpoint(vl_dir):
    config = AutoConfig.from_pretrained(vl_dir, local_files_only=True)
    assert config.model_type == "qwen2_5_vl" and config.architectures == ["Qwen2_5_VLForConditionalGeneration"]
    with open(f"{vl_dir}/processor_config.json") as f:
        assert json.load(f)["processor_class"] == "Qwen2_5_VLProcessor"
    processor = load_processor(vl_dir)
    tok = processor.tokenizer
    assert config.image_token_id == tok.convert_tokens_to_ids(IMAGE_PAD)
    assert config.vision_start_token_id == tok.convert_tokens_to_ids(VISION_START)
    assert config.vision_end_token_id == tok.convert_tokens_to_ids(VISION_END)
    assert is_vl_model(vl_dir)


def test_image_text_chat_forward_and_generate(vl_dir, frame):
    obs, image = frame
    processor, model = load_processor(vl_dir), load_policy(vl_dir)
    assert isinstance(processor, Qwen2_5_VLProcessor)
    assert type(model) is Qwen2_5_VLForConditionalGeneration
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": obs}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text.startswith(f"<|im_start|>user\n{VISION_START}{IMAGE_PAD}{VISION_END}")
    batch = processor(text=[text], images=[image], return_tensors="pt")
    (grid,) = batch["image_grid_thw"].tolist()
    num_image_tokens = int((batch["input_ids"] == model.config.image_token_id).sum())
    assert num_image_tokens == grid[0] * grid[1] * grid[2] // MERGE_SIZE**2 > 0
    assert batch["pixel_values"].shape[0] == grid[0] * grid[1] * grid[2]
    # the text around the image is the tokenizer's own: each grid cell one token
    assert processor.tokenizer.convert_tokens_to_ids("#") in batch["input_ids"][0].tolist()

    logits = model(**batch).logits
    assert logits.shape == (1, batch["input_ids"].shape[1], model.config.text_config.vocab_size)
    out = model.generate(**batch, max_new_tokens=4, do_sample=False)
    assert out.shape == (1, batch["input_ids"].shape[1] + 4)
    assert torch.equal(out[0, : batch["input_ids"].shape[1]], batch["input_ids"][0])


def test_the_image_changes_the_logits(vl_dir, frame):
    obs, image = frame
    processor, model = load_processor(vl_dir), load_policy(vl_dir)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Go"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    a = processor(text=[text], images=[image], return_tensors="pt")
    b = processor(text=[text], images=[255 - image], return_tensors="pt")
    assert torch.equal(a["input_ids"], b["input_ids"])
    with torch.no_grad():
        assert not torch.allclose(model(**a).logits[0, -1], model(**b).logits[0, -1])


def test_a_text_only_dir_is_not_vl(tmp_path):
    path = build_tiny_model(tmp_path / "lm", corpus=["hi"])
    assert not is_vl_model(path)
    assert type(load_policy(path)) is type(load_causal_lm(path))


def test_a_hub_layout_dir_loads_the_same_processor(vl_dir, frame, tmp_path):
    """A downloaded Qwen2.5-VL dir names its processor in preprocessor_config.json and keeps the
    chat template in chat_template.json; it loads into the same processor."""
    import shutil

    hub = tmp_path / "hub"
    shutil.copytree(vl_dir, hub)
    (hub / "processor_config.json").unlink()
    template = (hub / "chat_template.jinja").read_text()
    (hub / "chat_template.jinja").unlink()
    (hub / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    pre = json.loads((hub / "preprocessor_config.json").read_text())
    (hub / "preprocessor_config.json").write_text(json.dumps({**pre, "processor_class": "Qwen2_5_VLProcessor"}))
    obs, image = frame
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": obs}]}]
    made = []
    for path in (vl_dir, hub):
        processor = load_processor(path)
        assert isinstance(processor, Qwen2_5_VLProcessor)
        text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        made.append(processor(text=[text], images=[image], return_tensors="pt"))
    assert torch.equal(made[0]["input_ids"], made[1]["input_ids"])
    assert torch.equal(made[0]["pixel_values"], made[1]["pixel_values"])


def _width_angle_per_cell(model, batch) -> float:
    """The smallest angle (rad) by which the text model's width rotary pairs turn between two
    image tokens side by side in a row: the positional signal telling neighbouring cells apart."""
    positions, _ = model.model.get_rope_index(
        batch["input_ids"], batch["mm_token_type_ids"], image_grid_thw=batch["image_grid_thw"]
    )
    image = (batch["input_ids"][0] == model.config.image_token_id).nonzero().flatten()
    first, second = positions[:, 0, image[0]], positions[:, 0, image[1]]
    assert first[1] == second[1] and second[2] - first[2] == 1  # same row, next column
    rotary = model.model.language_model.rotary_emb
    section = model.config.text_config.rope_parameters["mrope_section"]
    width = rotary.inv_freq[sum(section[:2]) : sum(section)]
    return float(width.min())


def test_neighbouring_cells_get_rotary_positions_the_tiny_model_can_tell_apart(vl_dir, frame):
    _, image = frame
    processor, model = load_processor(vl_dir), load_policy(vl_dir)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Go"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    batch = processor(text=[text], images=[image], return_tensors="pt")
    assert _width_angle_per_cell(model, batch) > 0.1
    # Qwen2.5-VL's own base on this tiny head: the width pairs barely turn from cell to cell
    config = model.config
    config.text_config.rope_parameters["rope_theta"] = 1e6
    qwen_base = Qwen2_5_VLForConditionalGeneration._from_config(config)
    assert _width_angle_per_cell(qwen_base, batch) < 1e-3
