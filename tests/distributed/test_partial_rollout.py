"""Interruptible generation (partial rollout) in the inference worker: a weight update stops the
running requests at a token boundary; "continue" serves each on from where it stopped, "abort"
serves it again from the start, "finish" never stops one. The update is made to land after a
known number of model calls (a forward pre-hook holds the engine there until the update waits),
so every case is exact, not a race."""

import asyncio
import threading

import pytest
import torch

from roll.agentic.episode import TokenLedger
from roll.algorithms.off_policy import truncated_importance_weights
from roll.core.fields import Batch
from roll.core.records import GenerateOutput, GenerateRequest, SamplingParams, Trajectory
from roll.distributed.workers.inference import InferenceWorker
from roll.distributed.workers.partial import PartialRequests, Segments, continuation
from roll.models.tiny import build_tiny_model
from roll.pipeline.phases.batch import build_traj_batch

MAX_NEW = 24
CALLS_BEFORE_UPDATE = 6  # the prefill and 5 decode steps: 6 tokens sampled on the old weights


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return build_tiny_model(str(tmp_path_factory.mktemp("tiny") / "m"), corpus=["You are P."], seed=3)


def req(rid: str, seed: int, prompt=(2, 5, 9, 11), **kw) -> GenerateRequest:
    params = SamplingParams(max_new_tokens=kw.pop("max_new_tokens", MAX_NEW), temperature=kw.pop("temperature", 1.0))
    return GenerateRequest(rid, list(prompt), params, seed, **kw)


def perturbed(worker: InferenceWorker, scale: float) -> dict[str, torch.Tensor]:
    """The engine's weights, every tensor nudged by a fixed pattern (0: an exact copy)."""
    gen = torch.Generator().manual_seed(0)
    return {
        k: v + scale * torch.randn(v.shape, generator=gen, dtype=v.dtype)
        for k, v in worker.engine.model.state_dict().items()
    }


class HoldAt:
    """A forward pre-hook on the engine's model: before model call number `calls` it holds the
    engine thread until `release()` (the weight update is waiting by then). That call still runs
    on the old weights; the engine stops at the token boundary after it: `calls` tokens sampled."""

    def __init__(self, worker: InferenceWorker, calls: int):
        self.calls, self.seen = calls, 0
        self.reached, self.released = threading.Event(), threading.Event()
        self.handle = worker.engine.model.register_forward_pre_hook(self)

    def __call__(self, module, args):
        self.seen += 1
        if self.seen == self.calls:
            self.reached.set()
            self.released.wait(30)

    def release(self) -> None:
        self.released.set()
        self.handle.remove()


async def generate_with_updates(
    worker, requests, updates: list[tuple[int, dict]], hold_at=None
) -> list[GenerateOutput]:
    """Serve `requests` together; each (calls, weights) of `updates` is loaded as version 1, 2, ...
    once the engine has made that many more model calls (`hold_at(worker, calls)` holds it there:
    `HoldAt` by default, the vllm tests' own for vLLM's engine steps)."""
    tasks = [asyncio.create_task(worker.generate(r)) for r in requests]
    for version, (calls, weights) in enumerate(updates, start=1):
        hold = (hold_at or HoldAt)(worker, calls)
        await asyncio.to_thread(hold.reached.wait, 30)
        update = asyncio.create_task(worker.update_weights(weights, version))
        await asyncio.sleep(0.01)  # the update now waits for the engine call (`_drain_waiters`)
        assert worker._drain_waiters == 1
        hold.release()
        await update
    return list(await asyncio.gather(*tasks))


def full_length(model_path, static, seeds) -> list[GenerateOutput]:
    """Uninterrupted answers, and the premise: each runs to MAX_NEW (no early stop)."""
    ref = InferenceWorker(model_path, num_threads=1, static_decode=static)
    outs = asyncio.run(ref.generate_many([req(f"r{s}", s) for s in seeds]))
    assert all(len(o.token_ids) == MAX_NEW for o in outs), [len(o.token_ids) for o in outs]
    return outs


SEEDS = [10, 13]


@pytest.mark.parametrize("static", [True, False], ids=["slots", "dynamic"])
def test_continued_under_unchanged_weights_is_the_uninterrupted_answer(model_path, static):
    """Same weights loaded mid-generation: every token id is the uninterrupted run's (the seed's
    stream goes on at the next index); log-probs match to float round-off (the continued prefix
    is prefilled in one forward instead of token by token); nothing is thrown away."""
    expected = full_length(model_path, static, SEEDS)
    worker = InferenceWorker(model_path, num_threads=1, static_decode=static, interrupt="continue")
    same = perturbed(worker, 0.0)
    outs = asyncio.run(generate_with_updates(worker, [req(f"r{s}", s) for s in SEEDS], [(CALLS_BEFORE_UPDATE, same)]))
    for out, ref in zip(outs, expected, strict=True):
        assert out.token_ids == ref.token_ids
        torch.testing.assert_close(torch.tensor(out.logprobs), torch.tensor(ref.logprobs), atol=2e-6, rtol=0)
        assert out.token_versions == [0] * CALLS_BEFORE_UPDATE + [1] * (MAX_NEW - CALLS_BEFORE_UPDATE)
        assert out.policy_version == 1 and out.finish_reason == "length"
    counts = worker.take_interruptions()
    assert counts == {
        "interrupted_requests": 2,
        "discarded_tokens": 0,
        "recomputed_tokens": 2 * (4 + CALLS_BEFORE_UPDATE),  # prompt + the ids so far, per request
    }
    assert worker.take_interruptions() == dict.fromkeys(counts, 0)  # taken: counted once


@pytest.mark.parametrize("static", [True, False], ids=["slots", "dynamic"])
def test_old_tokens_keep_their_logprobs_and_new_ones_are_the_new_policys(model_path, static):
    """New weights mid-generation: the tokens sampled before keep the ids and log-probs the old
    weights gave them; the tokens after are the new weights' own, their log-probs those of a
    forward of the new model over prompt + every id before them (the prefix's KV recomputed)."""
    expected = full_length(model_path, static, SEEDS)
    worker = InferenceWorker(model_path, num_threads=1, static_decode=static, interrupt="continue")
    new = perturbed(worker, 0.05)
    requests = [req(f"r{s}", s) for s in SEEDS]
    outs = asyncio.run(generate_with_updates(worker, requests, [(CALLS_BEFORE_UPDATE, new)]))
    k = CALLS_BEFORE_UPDATE
    changed = 0
    for out, ref, r in zip(outs, expected, requests, strict=True):
        assert out.token_ids[:k] == ref.token_ids[:k] and out.logprobs[:k] == ref.logprobs[:k]
        ids = torch.tensor([r.prompt_ids + out.token_ids])
        with torch.no_grad():
            lp = torch.log_softmax(worker.engine.model(input_ids=ids).logits[0].float(), -1)
        n = len(r.prompt_ids)
        theirs = [lp[n - 1 + i, tok].item() for i, tok in enumerate(out.token_ids)]
        torch.testing.assert_close(torch.tensor(out.logprobs[k:]), torch.tensor(theirs[k:]), atol=1e-5, rtol=0)
        assert max(abs(a - b) for a, b in zip(out.logprobs[:k], theirs[:k])) > 1e-3  # the old ones are not
        changed += out.token_ids[k:] != ref.token_ids[k:]
        assert out.token_versions == [0] * k + [1] * (MAX_NEW - k)
    assert changed  # the new weights sampled other tokens somewhere after the update


def test_a_request_interrupted_twice_carries_three_versions(model_path):
    worker = InferenceWorker(model_path, num_threads=1, interrupt="continue")
    same = perturbed(worker, 0.0)
    (out,) = asyncio.run(generate_with_updates(worker, [req("a", SEEDS[0])], [(4, same), (5, same)]))
    (ref,) = full_length(model_path, None, SEEDS[:1])
    assert out.token_ids == ref.token_ids
    # 4 calls on version 0; the continuation's prefill and 4 decode steps on version 1; the rest on 2
    assert out.token_versions == [0] * 4 + [1] * 5 + [2] * (MAX_NEW - 9)
    assert worker.take_interruptions()["interrupted_requests"] == 2


def test_abort_throws_the_tokens_away_and_regenerates_on_the_new_weights(model_path):
    """ROLL's behaviour: the running request starts over under the new weights with the same
    seed, so its answer is exactly what a request sent after the update gets."""
    worker = InferenceWorker(model_path, num_threads=1, interrupt="abort")
    new = perturbed(worker, 0.05)
    (out,) = asyncio.run(generate_with_updates(worker, [req("a", SEEDS[0])], [(CALLS_BEFORE_UPDATE, new)]))
    fresh = asyncio.run(worker.generate(req("a", SEEDS[0])))
    assert out.token_ids == fresh.token_ids
    torch.testing.assert_close(torch.tensor(out.logprobs), torch.tensor(fresh.logprobs), atol=2e-6, rtol=0)
    assert out.token_versions == [1] * len(out.token_ids)
    assert worker.take_interruptions() == {
        "interrupted_requests": 1,
        "discarded_tokens": CALLS_BEFORE_UPDATE,
        "recomputed_tokens": 0,
    }


def test_finish_lets_the_running_request_end_on_the_old_weights(model_path):
    worker = InferenceWorker(model_path, num_threads=1)  # interrupt="finish"
    (ref,) = full_length(model_path, None, SEEDS[:1])
    new = perturbed(worker, 0.05)
    (out,) = asyncio.run(generate_with_updates(worker, [req("a", SEEDS[0])], [(CALLS_BEFORE_UPDATE, new)]))
    assert out.token_ids == ref.token_ids and out.token_versions == [0] * MAX_NEW
    assert worker.take_interruptions() == dict.fromkeys(
        ("interrupted_requests", "discarded_tokens", "recomputed_tokens"), 0
    )


def test_a_continued_turn_reaches_the_batch_with_its_versions_and_recorded_logprobs(model_path):
    """The trainer's view of a continued turn: `Batch.POLICY_VERSION` marks each token's version,
    `infer_logprobs` are the log-probs each version recorded, and truncated importance weights
    are taken per token against them."""
    worker = InferenceWorker(model_path, num_threads=1, interrupt="continue")
    new = perturbed(worker, 0.05)
    r = req("a", SEEDS[0])
    (out,) = asyncio.run(generate_with_updates(worker, [r], [(CALLS_BEFORE_UPDATE, new)]))
    ledger = TokenLedger(r.prompt_ids)
    ledger.add_turn(out)
    ledger.add_context([7, 7])
    traj = Trajectory(
        tag="T",
        traj_group_id="g",
        traj_id="g-0",
        env_seed=0,
        step_rewards=[1.0],
        success=True,
        stop_reason="terminated",
        policy_version=out.policy_version,
        num_actions=1,
        num_valid_actions=1,
        policy_versions=list(ledger.versions),
        **ledger.sample_fields(),
    )
    assert traj.oldest_policy_version == 0 and traj.policy_versions == [0]
    batch, _ = build_traj_batch([traj], pad_token_id=0)
    n, k = len(r.prompt_ids), CALLS_BEFORE_UPDATE
    versions = batch[Batch.POLICY_VERSION][0].tolist()
    assert versions == [-1] * n + [0] * k + [1] * (MAX_NEW - k) + [-1, -1]
    recorded = batch[Batch.INFER_LOGPROBS][0, n : n + MAX_NEW]
    torch.testing.assert_close(recorded, torch.tensor(out.logprobs))
    old = torch.zeros_like(batch[Batch.INFER_LOGPROBS])  # a trainer whose pi_old gives every token prob 1
    weights = truncated_importance_weights(
        old, batch[Batch.INFER_LOGPROBS], batch[Batch.RESPONSE_MASK], level="token", cap=1e9
    )
    torch.testing.assert_close(weights[0, n : n + MAX_NEW], (-torch.tensor(out.logprobs)).exp())


def test_continuation_and_segments_by_hand():
    r = GenerateRequest("x", [1, 2], SamplingParams(max_new_tokens=10), seed=5, session_id="s", sample_offset=3)
    before = Segments()
    before.add([7, 8], [-0.5, -0.25], version=4)
    cont = continuation(r, before)
    assert (cont.prompt_ids, cont.params.max_new_tokens, cont.seed, cont.sample_offset) == ([1, 2, 7, 8], 8, 5, 5)
    assert cont.session_id == "s" and r.params.max_new_tokens == 10  # the original is left as it was
    rest = GenerateOutput("x", [9], [-1.0], "stop", policy_version=6)
    whole = before.joined("x", rest)
    assert (whole.token_ids, whole.logprobs, whole.token_versions) == ([7, 8, 9], [-0.5, -0.25, -1.0], [4, 4, 6])
    assert whole.policy_version == 6 and whole.oldest_version == 4 and whole.finish_reason == "stop"
    with pytest.raises(ValueError, match="interrupt"):
        PartialRequests("pause")


def test_only_a_continuous_engine_interrupts(model_path):
    with pytest.raises(ValueError, match="needs a continuous engine"):
        InferenceWorker(model_path, num_threads=1, interrupt="continue", continuous_batching=False)


def test_an_offload_lets_the_running_requests_finish_even_with_partial_rollout(model_path):
    """Only a weight update interrupts: an offload (a colocated role taking the GPU) keeps the
    weights, so the running request finishes on them first, uninterrupted and uncounted."""
    worker = InferenceWorker(model_path, num_threads=1, interrupt="continue")
    (ref,) = full_length(model_path, None, SEEDS[:1])

    async def play():
        task = asyncio.create_task(worker.generate(req("a", SEEDS[0])))
        hold = HoldAt(worker, CALLS_BEFORE_UPDATE)
        await asyncio.to_thread(hold.reached.wait, 30)
        offload = asyncio.create_task(worker.offload())
        await asyncio.sleep(0.01)
        hold.release()
        await offload
        out = await task
        await worker.reload()
        return out

    out = asyncio.run(play())
    assert out.token_ids == ref.token_ids and out.token_versions == [0] * MAX_NEW
    assert worker.take_interruptions()["interrupted_requests"] == 0
