"""The step-wise VL env manager (roll/agentic/env_manager/vl_step_env_manager.py) on the tiny
Qwen2.5-VL of the VL FrozenLake example: each step sample is the engine's prompt and generated
ids (loss mask on the generated ones only) with that step's own images, each image is the env's
frame at that step, the state hash is equal exactly for equal frames, and on a seeded group GiGPO
finds the same anchor states from the frames as from the env's text observations.

The tests that need the lake to change use a scripted policy (a seeded random move a step, as the
engine's record); the others use the `hf` engine itself."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest
import torch

import envs  # noqa: F401  registers the built-ins
from roll.agentic.env.registry import make_env
from roll.agentic.env_manager.factory import make_env_manager
from roll.agentic.env_manager.step_env_manager import state_hash as text_state_hash
from roll.agentic.env_manager.vl_prompts import TooManyImages, frame_hash, user_content
from roll.agentic.env_manager.vl_step_env_manager import VLStepEnvManager
from roll.agentic.env_manager.vl_traj_env_manager import VLTrajEnvManager
from roll.agentic.episode import EnvSpec, EpisodeSpec
from roll.algorithms.actor_loss import PolicyLossOptions
from roll.algorithms.gigpo import anchor_group_stats, compute_gigpo_advantages
from roll.core.enums import SampleMode
from roll.core.fields import Batch
from roll.core.records import GenerateOutput, SamplingParams, Trajectory
from roll.models.loading import load_policy, load_processor, vision_token_ids
from roll.pipeline.phases.batch import build_step_batch
from roll.pipeline.tiny_model import main as build_model
from tests.conftest import vl_engine

ENV_CONFIG = {
    "size": 4,
    "hole_prob": 0.2,
    "is_slippery": False,
    "max_path_length": 8,
    "show_neighbours": False,
    "render_mode": "rgb_array",
}
SYSTEM = "You cross a frozen lake."
MOVES = ("Left", "Down", "Right", "Up")


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory):
    return build_model(["--preset", "vl_frozen_lake", "--output_dir", str(tmp_path_factory.mktemp("m") / "vl")])


@pytest.fixture(scope="module")
def processor(vl_dir):
    return load_processor(vl_dir)


@pytest.fixture(scope="module")
def engine(vl_dir):
    return vl_engine(vl_dir)


def spec(max_steps: int = 6, history_length: int | None = None) -> EnvSpec:
    return EnvSpec(
        tag="VLFrozenLake",
        env_type="frozen_lake",
        env_config=dict(ENV_CONFIG),
        max_steps=max_steps,
        max_tokens_per_step=1,
        response_prefix="<answer>",
        agent_system_template=SYSTEM,
        pre_step_template="\nTurn {turn_idx}:\n",
        next_step_template="\n{actions_left} actions left\n",
        history_length=history_length,
    )


def manager(processor, generate, history_length=0, max_steps=6, max_images=None) -> VLStepEnvManager:
    sampling = SamplingParams(max_new_tokens=1, temperature=1.0)
    return VLStepEnvManager(
        spec(max_steps),
        processor,
        generate,
        sampling,
        512,
        history_length=history_length,
        max_images_per_prompt=max_images,
    )


def engine_policy(engine, sent: list, answers: list):
    async def generate(request):
        sent.append(request)
        answers.append(engine.generate_batch([request])[0])
        return answers[-1]

    return generate


def scripted_policy(processor, seed: int, sent: list):
    """A seeded random word a step, returned as the engine returns its ids: one of the four moves,
    or (one time in five) "G", an invalid answer (format penalty, the lake unchanged)."""
    move_ids = [processor.tokenizer.convert_tokens_to_ids(m) for m in (*MOVES, "G")]
    assert processor.tokenizer.unk_token_id not in move_ids
    rng = np.random.default_rng(seed)

    async def generate(request):
        sent.append(request)
        return GenerateOutput(request.request_id, [int(rng.choice(move_ids))], [-1.25], "length", 0)

    return generate


def play(vl, env_seed: int, traj_id: str = "g-0", sample_seed: int = 1) -> Trajectory:
    return asyncio.run(vl.run_episode(EpisodeSpec("g", traj_id, env_seed=env_seed, sample_seed=sample_seed)))


def replay(vl, traj: Trajectory) -> list[tuple[np.ndarray, str]]:
    """(frame, text observation) before each step of `traj`, from a fresh env replaying its answers."""
    env = make_env("frozen_lake", dict(ENV_CONFIG))
    obs, _ = env.reset(seed=traj.env_seed)
    seen = []
    for step in traj.steps:
        seen.append((env.render(), obs))
        obs = env.step(vl.chat.response_text(step.response_ids))[0]
    return seen


def instruction() -> str:
    return make_env("frozen_lake", dict(ENV_CONFIG)).reset(seed=0)[1]["env_instruction"]


def turn(k: int, with_instruction: bool) -> dict:
    before = ("" if not with_instruction else instruction()) + f"\nTurn {k + 1}:\n"
    return {"role": "user", "content": user_content(before, f"\n{6 - k} actions left\n")}


def processed(processor, messages: list[dict], frames: list[np.ndarray]):
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) + "<answer>"
    return processor(text=[text], images=frames, return_tensors="pt")


def test_step_samples_are_the_engines_ids_with_the_loss_on_generated_ids_only(processor, engine):
    sent, answers = [], []
    vl = manager(processor, engine_policy(engine, sent, answers))
    traj = play(vl, env_seed=3)
    assert len(traj.steps) == len(sent) == traj.num_actions >= 2 and not traj.token_ids
    for k, (step, request, out) in enumerate(zip(traj.steps, sent, answers)):
        assert step.step == k and request.session_id is None
        assert step.prompt_ids == request.prompt_ids and step.response_ids == out.token_ids
        assert step.logprobs == out.logprobs
        assert step.images.num_images == request.images.num_images == 1  # history 0: the current frame
        assert torch.equal(step.images.pixel_values, request.images.pixel_values)
    batch, rows = build_step_batch([traj], pad_token_id=processor.tokenizer.pad_token_id)
    assert rows.step == list(range(len(traj.steps))) and rows.state_hash == [s.state_hash for s in traj.steps]
    for i, (request, out) in enumerate(zip(sent, answers)):
        p, n = len(request.prompt_ids), len(request.prompt_ids) + len(out.token_ids)
        assert batch[Batch.INPUT_IDS][i, :n].tolist() == request.prompt_ids + out.token_ids
        expected_mask = torch.zeros(batch[Batch.INPUT_IDS].shape[1])
        expected_mask[p:n] = 1.0
        assert torch.equal(batch[Batch.RESPONSE_MASK][i], expected_mask)
        assert batch[Batch.INFER_LOGPROBS][i, p:n].tolist() == pytest.approx(out.logprobs)
        pixels = request.images.pixel_values
        assert torch.equal(batch[Batch.PIXEL_VALUES][i, : len(pixels)], pixels)
        assert batch[Batch.IMAGE_GRID_THW][i].tolist() == request.images.image_grid_thw
    generated = {t for request, out in zip(sent, answers) for t in out.token_ids}
    assert not generated & set(vision_token_ids(engine.model.config))


def test_each_step_prompt_is_the_processors_rendering_of_that_steps_frame(processor):
    sent = []
    vl = manager(processor, scripted_policy(processor, seed=0, sent=sent))
    traj = play(vl, env_seed=0)
    seen = replay(vl, traj)
    assert len({frame_hash(frame) for frame, _ in seen}) >= 3  # the lake changed: later frames are checked
    for k, (step, (frame, _)) in enumerate(zip(traj.steps, seen)):
        expected = processed(processor, [{"role": "system", "content": SYSTEM}, turn(k, True)], [frame])
        assert step.prompt_ids == expected["input_ids"][0].tolist()
        assert torch.equal(step.images.pixel_values, expected["pixel_values"])  # the env's frame at step k
        assert step.state_hash == frame_hash(frame)
    # a step's first prompt is the VL trajectory manager's first prompt, id for id
    traj_vl = VLTrajEnvManager(spec(), processor, None, SamplingParams(max_new_tokens=1), 512)
    obs, info = traj_vl.env.reset(seed=0)
    assert traj.steps[0].prompt_ids == traj_vl.new_builder(info["env_instruction"], obs).ledger.token_ids


def test_a_history_shows_the_last_frames_and_answers(processor):
    sent = []
    vl = manager(processor, scripted_policy(processor, seed=0, sent=sent), history_length=1)
    traj = play(vl, env_seed=0)
    seen = replay(vl, traj)
    assert len(traj.steps) >= 3
    for k, step in enumerate(traj.steps):
        if k == 0:
            messages, frames = [turn(0, True)], [seen[0][0]]
        else:
            answer = vl.chat.response_text(traj.steps[k - 1].response_ids)
            messages = [turn(k - 1, True), {"role": "assistant", "content": answer}, turn(k, False)]
            frames = [seen[k - 1][0], seen[k][0]]
        expected = processed(processor, [{"role": "system", "content": SYSTEM}, *messages], frames)
        assert step.prompt_ids == expected["input_ids"][0].tolist()
        assert step.images.num_images == len(frames) == min(k, 1) + 1
        assert torch.equal(step.images.pixel_values, expected["pixel_values"])
        assert step.state_hash == frame_hash(seen[k][0])  # the current frame's, not the history's


def test_requests_carry_their_frames_only_for_an_engine_that_takes_them(processor):
    """With `send_frames` (the vllm engine) a request's frames are the images of its prompt, the
    ones its pixel values were made from; the step samples and an `hf` engine's requests carry none."""
    sent, plain = [], []
    vl = manager(processor, scripted_policy(processor, seed=0, sent=plain), history_length=1)
    play(vl, env_seed=0)
    assert plain and all(r.images.frames is None for r in plain)
    framed = VLStepEnvManager(
        dataclasses.replace(spec(), send_frames=True),
        processor,
        scripted_policy(processor, seed=0, sent=sent),
        SamplingParams(max_new_tokens=1, temperature=1.0),
        512,
        history_length=1,
    )
    traj = play(framed, env_seed=0)
    seen = replay(framed, traj)
    assert len(sent) == len(traj.steps) >= 3
    for k, (request, step) in enumerate(zip(sent, traj.steps)):
        expected = [seen[k - 1][0], seen[k][0]] if k else [seen[0][0]]
        assert len(request.images.frames) == len(expected)
        assert all(np.array_equal(a, b) for a, b in zip(request.images.frames, expected))
        assert step.images.frames is None and request.prompt_ids == plain[k].prompt_ids
        again = processor.image_processor(images=request.images.frames, return_tensors="pt")["pixel_values"]
        assert torch.equal(again, request.images.pixel_values)


def test_a_prompt_over_the_image_limit_is_an_error(processor):
    vl = manager(processor, scripted_policy(processor, seed=0, sent=[]), history_length=1, max_images=1)
    with pytest.raises(TooManyImages, match="limit_mm_per_prompt"):
        play(vl, env_seed=0)  # step 1 would show two frames


def test_equal_frames_share_a_state_hash_and_different_frames_do_not():
    env = make_env("frozen_lake", dict(ENV_CONFIG))
    env.reset(seed=3)
    frame = env.render()
    assert frame_hash(frame) == frame_hash(env.render()) == frame_hash(frame.copy())
    changed = frame.copy()
    changed[0, 0, 0] ^= 1
    assert frame_hash(changed) != frame_hash(frame)
    assert frame_hash(frame.reshape(-1, frame.shape[-1])) != frame_hash(frame)  # same bytes, other shape
    env.reset(seed=4)
    assert frame_hash(env.render()) != frame_hash(frame)  # another map


def play_group(processor, env_seed: int, members: int) -> list[Trajectory]:
    trajs = []
    for m in range(members):
        vl = manager(processor, scripted_policy(processor, seed=100 + m, sent=[]))
        trajs.append(play(vl, env_seed, traj_id=f"g-{m}", sample_seed=m))
    return trajs


def test_gigpo_finds_the_anchor_states_of_a_seeded_group_from_its_frames(processor):
    trajs = play_group(processor, env_seed=0, members=6)
    vl = manager(processor, None)
    seen = [pair for traj in trajs for pair in replay(vl, traj)]
    batch, rows = build_step_batch(trajs, pad_token_id=processor.tokenizer.pad_token_id)
    assert len(rows.state_hash) == len(seen)
    # equal frames <=> equal hashes <=> equal text observations (the text manager's anchors)
    for i, (frame_i, text_i) in enumerate(seen):
        for j, (frame_j, text_j) in enumerate(seen):
            same = rows.state_hash[i] == rows.state_hash[j]
            assert same == np.array_equal(frame_i, frame_j) == (text_i == text_j)
    assert len({rows.state_hash[i] for i, s in enumerate(rows.step) if s == 0}) == 1  # one start state
    text_hashes = [text_state_hash(text) for _, text in seen]
    stats = anchor_group_stats(rows.traj_group_id, rows.state_hash)
    assert stats == anchor_group_stats(rows.traj_group_id, text_hashes)
    assert 1 < stats["num_groups"] < len(seen) and stats["nonsingleton_frac"] > 0

    def advantages(hashes):
        return compute_gigpo_advantages(
            rows.episode_scores,
            rows.step_rewards,
            rows.traj_group_id,
            rows.traj_id,
            hashes,
            rows.step,
            gamma=0.95,
            norm_std=True,
        )

    by_frames = advantages(rows.state_hash)
    assert torch.equal(by_frames, advantages(text_hashes))
    assert not torch.equal(by_frames, advantages([f"{i}" for i in range(len(seen))]))  # the anchors matter


def test_the_factory_and_the_env_worker_pick_the_vl_manager_by_sample_mode(processor, vl_dir):
    from roll.agentic.rollout.env_worker import EnvWorker

    sampling = SamplingParams(max_new_tokens=1)

    def made(mode: SampleMode, history: int | None = None):
        vl = dataclasses.replace(spec(history_length=history), vision=True)
        return make_env_manager(
            vl, processor.tokenizer, None, sampling, 512, mode=mode, history_length=2, processor=processor
        )

    assert type(made(SampleMode.TRAJ)) is VLTrajEnvManager
    step = made(SampleMode.STEP)
    assert type(step) is VLStepEnvManager and step.history_length == 2  # the manager's
    assert made(SampleMode.STEP, history=0).history_length == 0  # the tag's own wins
    with pytest.raises(ValueError, match="processor"):  # image observations need the model's processor
        make_env_manager(
            dataclasses.replace(spec(), vision=True),
            processor.tokenizer,
            None,
            sampling,
            512,
            mode=SampleMode.STEP,
            history_length=0,
        )
    vl_spec = dataclasses.replace(spec(), vision=True)

    async def worker(mode: str):
        return EnvWorker([vl_spec], 2, vl_dir, [object()], sampling, 512, manager_type=mode)

    assert all(type(m) is VLStepEnvManager for m in asyncio.run(worker("step")).groups[0])
    assert all(type(m) is VLTrajEnvManager for m in asyncio.run(worker("traj")).groups[0])


# --- the trainer: a step batch carries each row's own images ---


def test_the_trainer_scores_step_samples_with_their_own_images(processor, engine, vl_dir):
    from roll.distributed.strategies.torch_train import TorchTrainStrategy

    trajs = []
    for m, env_seed in enumerate((3, 3, 5)):
        trajs.append(play(manager(processor, engine_policy(engine, [], [])), env_seed, f"g-{m}", sample_seed=m))
    batch, _ = build_step_batch(trajs, pad_token_id=processor.tokenizer.pad_token_id)
    trainer = TorchTrainStrategy(
        load_policy(vl_dir),
        learning_rate=1e-2,
        weight_decay=0.0,
        adam_betas=(0.9, 0.999),
        adam_epsilon=1e-8,
        lr_scheduler_type="constant",
        warmup_steps=0,
        total_steps=1,
        max_grad_norm=1.0,
        micro_batch_size=3,
        metric_prefix="actor",
    )
    logprobs, _ = trainer.forward_logprobs(batch, temperature=1.0)
    mask = batch[Batch.RESPONSE_MASK].bool()
    assert torch.allclose(logprobs[mask], batch[Batch.INFER_LOGPROBS][mask], atol=1e-4)
    swapped = batch.clone()
    swapped[Batch.PIXEL_VALUES] = batch[Batch.PIXEL_VALUES].roll(1, dims=0)
    moved, _ = trainer.forward_logprobs(swapped, temperature=1.0)
    assert not torch.allclose(moved[mask], logprobs[mask], atol=1e-4)  # each row is scored with its own images


# --- the actor worker: what the pipeline calls, images included ---


@pytest.fixture(scope="module")
def step_batch(processor, engine):
    """Step samples of two episodes on one map and one on another: history 0, so a turn's prompt
    ids are the same in every episode and only the rows' images tell them apart."""
    trajs = [
        play(manager(processor, engine_policy(engine, [], [])), env_seed, f"g-{m}", sample_seed=m)
        for m, env_seed in enumerate((3, 3, 5))
    ]
    batch, _ = build_step_batch(trajs, pad_token_id=processor.tokenizer.pad_token_id)
    return batch


def test_the_actor_worker_scores_and_trains_each_row_with_its_images(vl_dir, step_batch):
    """`ActorWorker.compute_logprobs` (the PPO old log-probs) is the engine's, and the first
    mini-batch of `train` sees the same distribution (ratio exactly 1, nothing clipped): neither
    call may leave the images behind, which scores a VL row as text and makes every ratio noise."""
    from roll.configs.worker import TrainingArgs
    from roll.distributed.micro_batches import batch_rows
    from roll.distributed.workers.actor import ActorWorker

    batch = step_batch.clone()
    rows = len(batch)
    mask = batch[Batch.RESPONSE_MASK].bool()
    prompts = [
        (tuple(ids[m & ~r].tolist()), pixels.numpy().tobytes())
        for ids, m, r, pixels in zip(
            batch[Batch.INPUT_IDS], mask | batch[Batch.ATTENTION_MASK].bool(), mask, batch[Batch.PIXEL_VALUES]
        )
    ]
    assert len({ids for ids, _ in prompts}) < len(set(prompts))  # rows with equal ids show other frames ...
    shared = batch_rows(batch, dedupe=True)
    assert len(shared.index) == len(set(prompts)) < rows  # ... and rows share a forward only on equal frames
    assert all(prompts[int(shared.index[u])] == p for u, p in zip(shared.inverse, prompts))
    args = TrainingArgs(learning_rate=1e-2, per_device_train_batch_size=rows, gradient_accumulation_steps=1)
    actor = ActorWorker(vl_dir, args, total_train_steps=1, seed=7, num_threads=1)
    batch[Batch.OLD_LOGPROBS] = actor.compute_logprobs(batch, 1.0)
    assert torch.allclose(batch[Batch.OLD_LOGPROBS][mask], batch[Batch.INFER_LOGPROBS][mask], atol=1e-4)
    batch[Batch.ADVANTAGES] = torch.where(mask, torch.linspace(-1, 1, rows)[:, None], 0.0)
    metrics = actor.train(batch, PolicyLossOptions(), ppo_epochs=1, step=0)
    assert metrics["losses/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["losses/clipfrac"] == 0.0 and metrics["actor/unique_row_ratio"] == shared.ratio
    assert metrics["actor/grad_norm"] > 0
