"""The `hf` engine on the tiny Qwen2.5-VL (`strategies/hf/vl_generate.py`): the requests of one call
batched (one prefill, each row with its own images) give each row what it gets alone; the
log-probs are the trainer's (M-RoPE positions on both sides); a session's KV is reused across the
turns of a VL episode with the same answers, and never past an image that differs."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest
import torch

import envs  # noqa: F401  registers the built-ins
from roll.agentic.env_manager.vl_traj_env_manager import VLTrajEnvManager
from roll.agentic.episode import EnvSpec, EpisodeSpec
from roll.core.records import GenerateRequest, ImageInputs, SamplingParams
from roll.distributed.micro_batches import token_logprobs
from roll.distributed.row_images import RowImages, image_hashes
from roll.distributed.strategies.hf.vl_generate import batch_groups, image_keys
from roll.models.loading import load_processor
from roll.pipeline.tiny_model import main as build_model
from tests.conftest import vl_engine


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory):
    return build_model(["--preset", "vl_frozen_lake", "--output_dir", str(tmp_path_factory.mktemp("m") / "vl")])


@pytest.fixture(scope="module")
def processor(vl_dir):
    return load_processor(vl_dir)


@pytest.fixture(scope="module")
def engine(vl_dir):
    return vl_engine(vl_dir)


def image_request(processor, i: int, words: str, height: int, params: SamplingParams) -> GenerateRequest:
    """A prompt of text, one random image of `height` rows, text; seed i."""
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": words}, {"type": "image"}, {"type": "text", "text": "go"}],
        }
    ]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    image = (np.random.default_rng(i).random((height, 56, 3)) * 255).astype(np.uint8)
    out = processor(text=[text], images=[image], return_tensors="pt")
    images = ImageInputs(out["pixel_values"], out["image_grid_thw"].tolist())
    return GenerateRequest(f"r{i}", out["input_ids"][0].tolist(), params, seed=i, images=images)


def mixed_requests(processor) -> list[GenerateRequest]:
    """Different images (and grids), prompt lengths, greedy and sampled rows, max_new_tokens,
    and one text-only row."""
    greedy, sampled = SamplingParams(max_new_tokens=5, temperature=0.0), SamplingParams(max_new_tokens=7)
    requests = [
        image_request(processor, 0, "Go", 56, greedy),
        image_request(processor, 1, "Go left now please", 56, sampled),
        image_request(processor, 2, "up", 112, dataclasses.replace(sampled, max_new_tokens=4, top_k=5)),
        image_request(processor, 3, "down down down right", 84, dataclasses.replace(greedy, max_new_tokens=8)),
    ]
    text_ids = processor.tokenizer("left up", add_special_tokens=False)["input_ids"]
    return requests + [GenerateRequest("text", text_ids, sampled, seed=9)]


def test_a_batch_gives_each_row_what_it_gets_alone(engine, processor):
    requests = mixed_requests(processor)
    alone = [engine.generate_batch([r])[0] for r in requests]
    # one row stops early on a stop id it produces (its second token, found alone)
    stop = alone[1].token_ids[1]
    requests[1] = dataclasses.replace(
        requests[1], params=dataclasses.replace(requests[1].params, stop_token_ids=[stop])
    )
    alone[1] = engine.generate_batch([requests[1]])[0]
    assert alone[1].finish_reason == "stop" and len(alone[1].token_ids) < requests[1].params.max_new_tokens
    assert len({len(r.prompt_ids) for r in requests}) == len(requests)
    assert len({tuple(g) for r in requests[:4] for g in r.images.image_grid_thw}) == 3

    calls = engine.stats["prefill_calls"]
    together = engine.generate_batch(requests)
    assert engine.stats["prefill_calls"] == calls + 1
    for r, a, b in zip(requests, alone, together):
        assert b.request_id == r.request_id
        assert b.token_ids == a.token_ids and b.finish_reason == a.finish_reason
        assert len(b.token_ids) == r.params.max_new_tokens or b.finish_reason == "stop"
        assert np.allclose(b.logprobs, a.logprobs, atol=1e-5)
    # and in another order, with another row's images next to each
    shuffled = engine.generate_batch(requests[::-1])[::-1]
    assert [o.token_ids for o in shuffled] == [o.token_ids for o in alone]


def test_the_engines_logprobs_are_the_trainers_with_mrope_positions(engine, processor):
    """The trainer's forward (`token_logprobs`) over prompt + answer gives the engine's log-probs;
    without the multimodal positions (plain 1-D ones) it would not."""
    requests = [r for r in mixed_requests(processor)[:4] if not r.params.greedy]
    for request, out in zip(requests, engine.generate_batch(requests)):
        ids = torch.tensor([request.prompt_ids + out.token_ids])
        vision = {
            "pixel_values": request.images.pixel_values,
            "image_grid_thw": torch.tensor(request.images.image_grid_thw),
        }
        pixels, grids = vision["pixel_values"][None], vision["image_grid_thw"][None]
        images = RowImages(pixels, grids, image_hashes(pixels, grids))
        logprobs, _ = token_logprobs(engine.model, ids, torch.ones_like(ids), 1.0, images=images)
        answer = logprobs[0, len(request.prompt_ids) :]
        assert torch.allclose(answer, torch.tensor(out.logprobs), atol=1e-5)
        with torch.no_grad():
            flat = engine.model(input_ids=ids, **vision).logits[0, len(request.prompt_ids) - 1 : -1].float()
        flat_logprobs = flat.log_softmax(-1).gather(1, torch.tensor(out.token_ids)[:, None])[:, 0]
        assert not torch.allclose(flat_logprobs, answer, atol=1e-4)


def test_batch_groups_keep_within_the_bounds(processor):
    requests = [r for r in mixed_requests(processor) if r.images is not None]
    patches = [sum(t * h * w for t, h, w in r.images.image_grid_thw) for r in requests]
    assert batch_groups(requests) == [[0, 1, 2, 3]]
    groups = batch_groups(requests, max_patches=patches[0] + patches[1])
    assert groups == [[0, 1], [2], [3]]
    width = max(len(r.prompt_ids) for r in requests)
    assert batch_groups(requests, max_tokens=2 * width) == [[0, 1], [2, 3]]
    assert batch_groups(requests, max_patches=1, max_tokens=1) == [[0], [1], [2], [3]]


def test_a_call_over_the_bounds_is_served_in_groups_with_the_same_answers(engine, processor, monkeypatch):
    from roll.distributed.strategies.hf import vl_generate

    requests = mixed_requests(processor)
    alone = [engine.generate_batch([r])[0] for r in requests]
    patches = [sum(t * h * w for t, h, w in r.images.image_grid_thw) for r in requests[:4]]
    monkeypatch.setattr(vl_generate, "MAX_BATCH_PATCHES", patches[0] + patches[1])
    calls = engine.stats["prefill_calls"]
    split = engine.generate_batch(requests)
    assert engine.stats["prefill_calls"] == calls + 3  # [0, 1], [2], [3, text]
    assert [o.token_ids for o in split] == [o.token_ids for o in alone]
    assert all(np.allclose(a.logprobs, b.logprobs, atol=1e-5) for a, b in zip(split, alone))


def test_rows_equal_in_ids_and_images_are_prefilled_once(vl_dir, processor):
    """Group members start from the same prompt and frame: computed once, each row still sampled
    with its own seed; equal ids with another image are another row. Their KV is each row's own."""
    engine = vl_engine(vl_dir)
    a = image_request(processor, 0, "Go", 56, SamplingParams(max_new_tokens=4))
    twin = dataclasses.replace(a, request_id="twin", seed=5, session_id="twin")
    other_image = dataclasses.replace(
        a, request_id="other", images=ImageInputs(a.images.pixel_values.flip(0), a.images.image_grid_thw)
    )
    b = image_request(processor, 1, "Go left now please", 56, SamplingParams(max_new_tokens=4))
    requests = [a, twin, b, other_image]
    alone = [engine.generate_batch([r])[0] for r in requests]
    engine.release("twin")
    before = dict(engine.stats)
    together = engine.generate_batch(requests)
    assert engine.stats["prefill_rows_computed"] - before["prefill_rows_computed"] == 3
    assert engine.stats["prefill_tokens"] - before["prefill_tokens"] == sum(len(r.prompt_ids) for r in requests)
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    assert together[0].token_ids != together[1].token_ids  # the same distribution, other seeds
    assert all(np.allclose(x.logprobs, y.logprobs, atol=1e-5) for x, y in zip(together, alone))
    # the twin's session holds its own KV: asked again, it reuses all but the last id and answers the same
    again = engine.generate_batch([twin])[0]
    assert engine.stats["prefix_tokens_reused"] - before["prefix_tokens_reused"] == len(twin.prompt_ids) - 1
    assert again.token_ids == alone[1].token_ids and np.allclose(again.logprobs, alone[1].logprobs, atol=1e-5)


def test_image_keys_tell_images_apart(processor):
    a = image_request(processor, 0, "Go", 56, SamplingParams()).images
    b = ImageInputs(a.pixel_values.flip(0), a.image_grid_thw)
    assert image_keys(a) == image_keys(ImageInputs(a.pixel_values.clone(), a.image_grid_thw))
    assert image_keys(a) != image_keys(b) and len(image_keys(a)) == 1 and image_keys(None) == ()


# --- KV reuse across the turns of a VL episode ---

SOKOBAN = {"dim_room": [6, 6], "num_boxes": 1, "search_depth": 10, "render_mode": "rgb_array"}


def play(processor, engine, temperature: float, sent: list | None = None):
    """A 3-turn Sokoban episode seen as images, on `engine` (stats counted from 0); `sent` gets
    each turn's (request, answer)."""

    async def generate(request):
        out = engine.generate_batch([request])[0]
        if sent is not None:
            sent.append((request, out))
        return out

    spec = EnvSpec(
        tag="SimpleSokoban",
        env_type="sokoban",
        env_config=SOKOBAN,
        max_steps=3,
        max_tokens_per_step=6,
        agent_system_template="You play Sokoban.",
    )
    sampling = SamplingParams(max_new_tokens=6, temperature=temperature)
    manager = VLTrajEnvManager(spec, processor, generate, sampling, 4096)
    for key in engine.stats:
        engine.stats[key] = 0
    return asyncio.run(manager.run_episode(EpisodeSpec("g", "g-0", env_seed=3, sample_seed=1)))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_vl_episode_reuses_its_kv_with_the_same_answers(vl_dir, processor, temperature):
    fresh, reusing = vl_engine(vl_dir, max_cached_tokens=0), vl_engine(vl_dir)
    sent = []
    a = play(processor, fresh, temperature)
    fresh_prefill = fresh.stats["prefill_tokens"]
    b = play(processor, reusing, temperature, sent)
    requests = [r for r, _ in sent]
    assert a.num_actions == b.num_actions == 3
    assert [r.session_id for r in requests] == ["g-0"] * 3 and [r.images.num_images for r in requests] == [1, 2, 3]
    assert b.token_ids == a.token_ids
    assert np.allclose(b.infer_logprobs, a.infer_logprobs, atol=1e-5)
    assert fresh.stats["prefix_tokens_reused"] == 0 and fresh_prefill == sum(len(r.prompt_ids) for r in requests)
    # turns 2 and 3 fed only what their prompt added to the ids the last turn fed (its prompt and
    # its answer but the last id), with only the new image
    reused = sum(len(r.prompt_ids) + len(out.token_ids) - 1 for r, out in sent[:2])
    assert reusing.stats["prefix_tokens_reused"] == reused
    assert reusing.stats["prefill_tokens"] == fresh_prefill - reused < fresh_prefill / 2


def test_a_session_never_serves_a_prompt_whose_earlier_image_differs(vl_dir, processor):
    """Turn 3's ids with its first image swapped for another: the session's KV is reused only up to
    that image, and the answer is a fresh prefill's; with the images as they were, it is reused
    up to the end of the previous answer."""
    sent = []
    engine = vl_engine(vl_dir)
    play(processor, engine, 1.0, sent)
    last = sent[-1][0]
    grids, pixels = last.images.image_grid_thw, last.images.pixel_values
    first = grids[0][0] * grids[0][1] * grids[0][2]
    swapped = torch.cat([pixels[:first].flip(0), pixels[first:]])
    changed = dataclasses.replace(last, request_id="changed", images=ImageInputs(swapped, grids))
    first_image_at = last.prompt_ids.index(engine.model.config.image_token_id)

    def ask(request):
        before = engine.stats["prefix_tokens_reused"]
        out = engine.generate_batch([request])[0]
        return out, engine.stats["prefix_tokens_reused"] - before

    expected, reused = ask(dataclasses.replace(changed, session_id=None))
    assert reused == 0
    served, reused = ask(changed)  # the session holds turn 3's prompt and answer, with the first image
    assert reused == first_image_at > 0
    assert served.token_ids == expected.token_ids
    assert np.allclose(served.logprobs, expected.logprobs, atol=1e-5)
    # the unchanged prompt reuses past its images
    engine.generate_batch([last])
    _, reused = ask(last)
    assert reused == len(last.prompt_ids) - 1
