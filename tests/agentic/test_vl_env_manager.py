"""The VL env manager with the `hf` engine on the tiny Qwen2.5-VL: prompts made by the model's own
processor, images sent with every request, and a trajectory whose ids, loss mask and log-probs
are exactly the engine's (a full forward over the trajectory with its images gives the same
log-probs)."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest
import torch

import envs  # noqa: F401  registers the built-ins
from roll.agentic.env_manager.vl_traj_env_manager import (
    ImageObservationError,
    TooManyImages,
    VLTrajEnvManager,
)
from roll.agentic.episode import EnvSpec, EpisodeSpec
from roll.core.records import SamplingParams
from roll.distributed.strategies.hf.device_sampling import suppress
from roll.distributed.strategies.hf.infer import HFInferStrategy
from roll.models.loading import load_policy, load_processor, vision_token_ids
from roll.pipeline.tiny_model import main as build_model
from tests.conftest import vl_engine

ENV_CONFIG = {"dim_room": [6, 6], "num_boxes": 1, "search_depth": 10, "render_mode": "rgb_array"}


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory):
    return build_model(["--preset", "vl_sokoban", "--output_dir", str(tmp_path_factory.mktemp("m") / "vl")])


@pytest.fixture(scope="module")
def processor(vl_dir):
    return load_processor(vl_dir)


@pytest.fixture(scope="module")
def engine(vl_dir):
    return vl_engine(vl_dir)


def spec(max_steps: int = 3, **env_config) -> EnvSpec:
    return EnvSpec(
        tag="SimpleSokoban",
        env_type="sokoban",
        env_config={**ENV_CONFIG, **env_config},
        max_steps=max_steps,
        max_tokens_per_step=6,
        agent_system_template="You play Sokoban.",
    )


def manager(processor, engine, sent, max_steps=3, max_images=None, answers=None, send_frames=False, **env_config):
    async def generate(request):
        sent.append(request)
        out = engine.generate_batch([request])[0]
        if answers is not None:
            answers.append(out)
        return out

    sampling = SamplingParams(max_new_tokens=6, temperature=1.0)
    vl_spec = dataclasses.replace(spec(max_steps, **env_config), send_frames=send_frames)
    return VLTrajEnvManager(vl_spec, processor, generate, sampling, 4096, max_images_per_prompt=max_images)


def test_a_trajectory_is_the_engines_ids_and_images(processor, engine, vl_dir):
    sent, answers = [], []
    vl = manager(processor, engine, sent, answers=answers)
    traj = asyncio.run(vl.run_episode(EpisodeSpec("g", "g-0", env_seed=3, sample_seed=1)))
    turns = len(sent)
    assert turns == traj.num_actions >= 2  # so later turns (continuations) are exercised too
    # every request extends the previous prompt by the generated ids and the next turn, and
    # carries one image per turn so far
    for k, request in enumerate(sent):
        assert request.images.num_images == k + 1
        assert traj.token_ids[: len(request.prompt_ids)] == request.prompt_ids
        assert request.session_id == traj.traj_id  # the engine may keep the episode's KV
    first = sent[0]
    image_id = engine.model.config.image_token_id
    grid = first.images.image_grid_thw[0]
    assert first.prompt_ids.count(image_id) == grid[0] * grid[1] * grid[2] // 4
    # the first prompt is the processor's own rendering of the chat
    messages = [
        {"role": "system", "content": "You play Sokoban."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": traj_instruction(vl) + "\nTurn 1:\nState:\n"},
                {"type": "image"},
                {"type": "text", "text": vl_next_text(vl, 0)},
            ],
        },
    ]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    vl.env.reset(seed=3)
    expected = processor(text=[text], images=[vl.env.render()], return_tensors="pt")
    assert first.prompt_ids == expected["input_ids"][0].tolist()
    assert torch.equal(first.images.pixel_values, expected["pixel_values"])
    # loss mask: 1 exactly on the ids each turn generated, which are the engine's own
    expected_mask = np.zeros(len(traj.token_ids), dtype=int)
    for request, out in zip(sent, answers):
        start = len(request.prompt_ids)
        assert traj.token_ids[start : start + len(out.token_ids)] == out.token_ids
        assert traj.infer_logprobs[start : start + len(out.token_ids)] == out.logprobs
        expected_mask[start : start + len(out.token_ids)] = 1
    mask = np.array(traj.response_mask)
    assert (mask == expected_mask).all()
    assert traj.turn_end_positions == [len(r.prompt_ids) + len(o.token_ids) - 1 for r, o in zip(sent, answers)]
    assert traj.images.num_images == turns and torch.equal(
        traj.images.pixel_values[: len(first.images.pixel_values)], first.images.pixel_values
    )
    assert not set(vision_token_ids(engine.model.config)) & {t for t, m in zip(traj.token_ids, mask) if m}

    # a full forward over the trajectory with its images (placed on their grids: M-RoPE) gives
    # the engine's log-probs
    ids = torch.tensor([traj.token_ids])
    with torch.no_grad():
        logits = engine.model(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            mm_token_type_ids=(ids == image_id).int(),
            pixel_values=traj.images.pixel_values,
            image_grid_thw=torch.tensor(traj.images.image_grid_thw),
        ).logits[0, :-1]
    logprobs = suppress(logits.float(), vision_token_ids(engine.model.config)).log_softmax(-1)
    picked = logprobs.gather(1, ids[0, 1:, None])[:, 0]
    positions = mask[1:].nonzero()[0]
    assert np.allclose(picked[positions].numpy(), np.array(traj.infer_logprobs)[positions + 1], atol=1e-4)


def test_requests_carry_their_frames_only_for_an_engine_that_takes_them(processor, engine):
    """With `send_frames` (the vllm engine) each request carries every frame of its prompt so far,
    those its pixel values were made from; the trajectory and an `hf` engine's requests carry none."""
    plain, framed = [], []
    traj_plain = asyncio.run(manager(processor, engine, plain).run_episode(EpisodeSpec("g", "g-0", 3, 1)))
    vl = manager(processor, engine, framed, send_frames=True)
    traj = asyncio.run(vl.run_episode(EpisodeSpec("g", "g-0", 3, 1)))
    assert len(framed) >= 2 and all(r.images.frames is None for r in plain) and traj.images.frames is None
    assert traj.token_ids == traj_plain.token_ids  # the same episode: frames change nothing else
    for k, request in enumerate(framed):
        frames = request.images.frames
        assert len(frames) == k + 1 and all(f.dtype == np.uint8 and f.ndim == 3 for f in frames)
        if k:
            assert all(a is b for a, b in zip(frames, framed[k - 1].images.frames))  # earlier turns' images
        again = processor.image_processor(images=frames, return_tensors="pt")["pixel_values"]
        assert torch.equal(again, request.images.pixel_values)
    vl.env.reset(seed=3)
    assert np.array_equal(framed[0].images.frames[0], vl.env.render())


def traj_instruction(vl) -> str:
    vl.env.reset(seed=3)
    return vl.env.instruction


def vl_next_text(vl, turn: int) -> str:
    from roll.agentic.env_manager.vl_traj_env_manager import NEXT_STEP_TEMPLATE

    return NEXT_STEP_TEMPLATE.format(actions_left=vl.spec.max_steps - turn, max_response_length=6)


def test_equal_seeds_give_equal_trajectories(processor, engine):
    def play():
        vl = manager(processor, engine, [])
        trajectory = asyncio.run(vl.run_episode(EpisodeSpec("g", "g-0", env_seed=5, sample_seed=2)))
        engine.release("g-0")  # as the env worker does when the group ends
        return trajectory

    a, b = play(), play()
    assert a.token_ids == b.token_ids and a.infer_logprobs == b.infer_logprobs


def test_an_env_without_images_is_refused_by_key(processor, engine):
    with pytest.raises(ImageObservationError, match=r"custom_envs\.SimpleSokoban\.env_config\.render_mode"):
        manager(processor, engine, [], render_mode=None)


def test_more_images_than_the_limit_is_an_error(processor, engine):
    vl = manager(processor, engine, [], max_steps=5, max_images=1)
    with pytest.raises(TooManyImages, match="limit_mm_per_prompt"):
        asyncio.run(vl.run_episode(EpisodeSpec("g", "g-0", env_seed=3, sample_seed=1)))


# --- the trainer: batches carry each row's images, and its forward passes them to the model ---


@pytest.fixture(scope="module")
def vl_trajectories(processor, engine):
    plays = [(3, 1), (5, 2), (3, 4)]  # two episodes of one start state, one of another
    return [
        asyncio.run(manager(processor, engine, []).run_episode(EpisodeSpec("g", f"g-{i}", env_seed=e, sample_seed=s)))
        for i, (e, s) in enumerate(plays)
    ]


def strategy(vl_dir, micro_batch_size: int):
    from roll.distributed.strategies.torch_train import TorchTrainStrategy

    return TorchTrainStrategy(
        load_policy(vl_dir),
        learning_rate=1e-2,
        weight_decay=0.0,
        adam_betas=(0.9, 0.999),
        adam_epsilon=1e-8,
        lr_scheduler_type="constant",
        warmup_steps=0,
        total_steps=1,
        max_grad_norm=1.0,
        micro_batch_size=micro_batch_size,
        metric_prefix="actor",
    )


@pytest.mark.parametrize("micro_batch_size", [1, 3])
def test_the_trainer_scores_the_engines_tokens_with_their_images(vl_dir, vl_trajectories, micro_batch_size):
    from roll.core.fields import Batch
    from roll.pipeline.phases.batch import build_traj_batch

    batch, _ = build_traj_batch(vl_trajectories, pad_token_id=0)
    grids = batch[Batch.IMAGE_GRID_THW]
    assert grids.shape[:2] == (3, max(tr.images.num_images for tr in vl_trajectories))
    logprobs, _ = strategy(vl_dir, micro_batch_size).forward_logprobs(batch, temperature=1.0)
    mask = batch[Batch.RESPONSE_MASK].bool()
    assert torch.allclose(logprobs[mask], batch[Batch.INFER_LOGPROBS][mask], atol=1e-4)


def test_a_row_is_scored_with_its_own_images(vl_dir, vl_trajectories):
    """Swapping two rows' images (same shapes) changes their log-probs: images are not shared
    between rows, even rows with equal ids."""
    from roll.core.fields import Batch
    from roll.pipeline.phases.batch import build_traj_batch

    batch, _ = build_traj_batch(vl_trajectories[:2], pad_token_id=0)
    swapped = batch.clone()
    swapped[Batch.PIXEL_VALUES] = batch[Batch.PIXEL_VALUES].flip(0)
    swapped[Batch.IMAGE_GRID_THW] = batch[Batch.IMAGE_GRID_THW].flip(0)
    trainer = strategy(vl_dir, 2)
    a, _ = trainer.forward_logprobs(batch, temperature=1.0)
    b, _ = trainer.forward_logprobs(swapped, temperature=1.0)
    mask = batch[Batch.RESPONSE_MASK].bool()
    assert not torch.allclose(a[mask], b[mask], atol=1e-4)


def test_a_ppo_step_trains_the_vision_tower(vl_dir, vl_trajectories):
    from roll.core.fields import Batch
    from roll.distributed.micro_batches import token_logprobs
    from roll.distributed.row_images import row_images
    from roll.pipeline.phases.batch import build_traj_batch

    batch, _ = build_traj_batch(vl_trajectories, pad_token_id=0)
    trainer = strategy(vl_dir, 1)
    visual = [p.detach().clone() for p in trainer.model.model.visual.parameters()]

    def loss_fn(model, micro):  # raise the generated tokens' log-probs
        logprobs, _ = token_logprobs(model, micro["input_ids"], micro["attention_mask"], 1.0, images=row_images(micro))
        mask = micro[Batch.RESPONSE_MASK]
        return -(logprobs * mask).sum() / mask.sum().clamp(min=1), {}

    metrics = trainer.train_step(batch, loss_fn)
    assert metrics["actor/grad_norm"] > 0
    after = list(trainer.model.model.visual.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(visual, after))


# --- the engine: requests with images ---


def test_a_session_never_serves_another_requests_images(processor, engine):
    """Equal ids, one session, different images: each answer is its own image's (the session's KV
    is reused only before the image)."""
    from roll.core.records import GenerateRequest, ImageInputs

    sent = []
    asyncio.run(
        manager(processor, engine, sent, max_steps=1).run_episode(EpisodeSpec("g", "g-0", env_seed=3, sample_seed=1))
    )
    first = sent[0]
    other = ImageInputs(first.images.pixel_values.flip(0), first.images.image_grid_thw)
    params = SamplingParams(max_new_tokens=3, temperature=1.0)

    def ask(images, session):
        request = GenerateRequest("r", first.prompt_ids, params, seed=7, session_id=session, images=images)
        return engine.generate_batch([request])[0]

    a, b = ask(first.images, "s"), ask(other, "s")
    assert np.allclose(ask(other, None).logprobs, b.logprobs, atol=1e-5)  # the session changed nothing
    assert a.logprobs != b.logprobs


def test_a_text_only_engine_refuses_images(processor, tmp_path):
    from roll.core.records import GenerateRequest, ImageInputs
    from roll.models.tiny import build_tiny_model

    path = build_tiny_model(tmp_path / "lm", corpus=["hi"])
    text_engine = HFInferStrategy(load_policy(path, training=False), 0, [3])
    request = GenerateRequest(
        "r", [1, 2], SamplingParams(max_new_tokens=1), 0, images=ImageInputs(torch.zeros(4, 8), [[1, 2, 2]])
    )
    with pytest.raises(ValueError, match="no vision tower"):
        text_engine.generate_batch([request])


def test_the_reference_scores_the_engines_tokens_with_their_images(vl_dir, vl_trajectories):
    from roll.core.fields import Batch
    from roll.distributed.workers.reference import ReferenceWorker
    from roll.pipeline.phases.batch import build_traj_batch

    batch, _ = build_traj_batch(vl_trajectories, pad_token_id=0)
    logprobs = ReferenceWorker(vl_dir, micro_batch_size=2).compute_logprobs(batch, temperature=1.0)
    mask = batch[Batch.RESPONSE_MASK].bool()
    assert torch.allclose(logprobs[mask], batch[Batch.INFER_LOGPROBS][mask], atol=1e-4)
