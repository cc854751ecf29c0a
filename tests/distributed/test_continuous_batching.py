"""Continuous batching in the hf engine: requests that arrive while a batch decodes join it at the
next step, finished rows leave at once, and every request gets the tokens batch-at-a-time decoding
gives it (greedy: token for token; seeded sampling: the same draws), session KV reuse included."""

import asyncio
import time

import pytest
import torch

from roll.core.records import GenerateRequest, SamplingParams
from roll.distributed.strategies.hf.continuous import serve
from roll.distributed.strategies.hf.infer import HFInferStrategy
from roll.distributed.workers.inference import InferenceWorker
from roll.models.loading import load_causal_lm, load_tokenizer
from roll.models.tiny import build_tiny_model


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return build_tiny_model(str(tmp_path_factory.mktemp("tiny") / "m"), corpus=["You are P."], seed=3)


def make_engine(model_path, **kw):
    tok = load_tokenizer(model_path)
    return HFInferStrategy(
        load_causal_lm(model_path), pad_token_id=tok.pad_token_id, eos_token_ids=[tok.eos_token_id], **kw
    )


def req(rid, prompt, seed, session=None, **kw):
    params = dict(max_new_tokens=6, temperature=1.0, do_sample=not kw.pop("greedy", False))
    params.update(kw)
    r = GenerateRequest(rid, prompt, SamplingParams(**params), seed)
    r.session_id = session
    return r


PROMPTS = [[2, 5, 9, 11], [2, 7], [2, 5, 5, 5, 5, 5, 9, 12, 13], [2, 5, 9, 11], [3, 4, 8], [2, 6, 6, 7, 10]]


def scripted_serve(engine, arrivals: dict[int, list[GenerateRequest]], max_rows: int = 64):
    """Run `serve` with `arrivals[k]` handed over at its k-th look at the queue; returns
    {request_id: (output, look at which it was answered)}."""
    looks, answers = [0], {}

    def take(n):
        batch = arrivals.get(looks[0], [])[:n]
        looks[0] += 1
        return batch

    def deliver(request, output):
        answers[request.request_id] = (output, looks[0])

    while any(k >= looks[0] for k in arrivals):  # `serve` returns when idle; arrivals may come later
        serve(engine, take, deliver, max_rows, stop_admitting=lambda: False)
    return answers


def assert_same(out, expected):
    assert out.token_ids == expected.token_ids and out.finish_reason == expected.finish_reason
    torch.testing.assert_close(torch.tensor(out.logprobs), torch.tensor(expected.logprobs), atol=1e-5, rtol=0)


@pytest.mark.parametrize("greedy", [True, False])
def test_staggered_requests_get_batch_at_a_time_tokens(model_path, greedy):
    engine = make_engine(model_path)
    reqs = [req(f"r{i}", p, seed=i, greedy=greedy, max_new_tokens=4 + 3 * i) for i, p in enumerate(PROMPTS)]
    arrivals = {0: reqs[:2], 2: [reqs[2]], 3: reqs[3:5], 9: [reqs[5]]}
    answers = scripted_serve(engine, arrivals)
    together = engine.generate_batch(reqs)
    for r, expected in zip(reqs, together):
        assert_same(answers[r.request_id][0], expected)
    assert engine.stats["joined_running"] == 4  # r2, r3, r4 joined running rows; so did r5 (r4 runs 16 steps)
    # no request waited for a batch: one handed over at look k with n tokens is answered at look k + n - 1
    # (its prefill and first token come with look k, then one token per decode step)
    arrived = {r.request_id: k for k, batch in arrivals.items() for r in batch}
    for r in reqs:
        out, answered = answers[r.request_id]
        assert answered == arrived[r.request_id] + len(out.token_ids) - 1


def test_finished_rows_leave_and_the_batch_narrows(model_path):
    engine = make_engine(model_path)
    long_row = req("long", PROMPTS[1], seed=1, greedy=True, max_new_tokens=12)
    short_rows = [req(f"s{i}", PROMPTS[2], seed=i, greedy=True, max_new_tokens=2) for i in range(3)]
    answers = scripted_serve(engine, {0: short_rows + [long_row]})
    # the short rows are answered after the prefill and one decode step; the long one after 11 steps
    assert {answers[f"s{i}"][1] for i in range(3)} == {1} and answers["long"][1] == 11
    assert engine.stats["decode_steps"] == 11
    assert answers["long"][0].token_ids == engine.generate_batch([long_row])[0].token_ids


def test_zero_and_one_token_requests_are_answered_at_admission(model_path):
    engine = make_engine(model_path)
    answers = scripted_serve(
        engine, {0: [req("z", PROMPTS[0], 1, max_new_tokens=0), req("o", PROMPTS[0], 2, max_new_tokens=1)]}
    )
    assert answers["z"][0].token_ids == [] and answers["z"][0].finish_reason == "length"
    assert len(answers["o"][0].token_ids) == 1 and engine.stats["decode_steps"] == 0


def test_sessions_reuse_kv_across_turns_like_the_batch_path(model_path):
    """Two conversations in two engines, one continuous, one batch-at-a-time: the same tokens,
    the same ids reused from the session cache and the same ids cached."""
    cont, batch = make_engine(model_path, max_cached_tokens=1000), make_engine(model_path, max_cached_tokens=1000)
    first = [req("a/0", PROMPTS[0], 1, session="a"), req("b/0", PROMPTS[2], 2, session="b", max_new_tokens=3)]
    answers = scripted_serve(cont, {0: [first[0]], 1: [first[1]]})
    expected = batch.generate_batch(first)
    for r, e in zip(first, expected):
        assert_same(answers[r.request_id][0], e)
    second = [
        req(f"{s}/1", r.prompt_ids + e.token_ids + [5, 6], 3 + i, session=s)
        for i, (s, r, e) in enumerate(zip("ab", first, expected))
    ]
    answers = scripted_serve(cont, {0: [second[1]], 2: [second[0]]})
    for r, e in zip(second, batch.generate_batch(second)):
        assert_same(answers[r.request_id][0], e)
    assert cont.stats["prefix_tokens_reused"] == batch.stats["prefix_tokens_reused"] > 0
    assert cont.stats["prefill_tokens"] == batch.stats["prefill_tokens"]
    assert cont.kv_cache.num_tokens == batch.kv_cache.num_tokens


def test_worker_lets_a_late_request_join_the_running_batch(model_path):
    """Through the inference worker: a short request sent while a long one decodes is answered
    before the long one finishes, in the same engine call."""
    worker = InferenceWorker(model_path, num_threads=1)

    async def play():
        long_turn = asyncio.ensure_future(
            worker.generate(req("long", PROMPTS[1], 1, greedy=True, max_new_tokens=60, stop_token_ids=[]))
        )
        while worker.engine.stats["decode_steps"] < 2:  # the long request is decoding
            await asyncio.sleep(0.001)
        short = await worker.generate(req("short", PROMPTS[0], 2, max_new_tokens=2))
        long_done_first, long_out = long_turn.done(), await long_turn
        await worker._loop_task  # the engine call ends once idle
        return short, long_done_first, long_out

    short, long_done_first, long_out = asyncio.run(play())
    assert not long_done_first and len(short.token_ids) >= 1
    assert worker.engine.stats["joined_running"] == 1 and worker.stats["engine_calls"] == 1
    assert worker.stats["requests"] == 2


@pytest.mark.parametrize("continuous", [False, True])
def test_batch_wait_lets_a_request_arriving_a_moment_later_share_the_engine_call(model_path, continuous):
    """`batch_wait_ms`: the idle engine waits for more requests before a call, and stops waiting
    once `max_batch_size` are pending (here long before the 20 s wait is over)."""
    worker = InferenceWorker(
        model_path, num_threads=1, max_batch_size=2, batch_wait_ms=20_000, continuous_batching=continuous
    )

    async def play():
        first = asyncio.ensure_future(worker.generate(req("a", PROMPTS[0], 1, max_new_tokens=2)))
        await asyncio.sleep(0.05)
        assert not first.done()  # still waiting for company
        second = await worker.generate(req("b", PROMPTS[1], 2, max_new_tokens=2))
        await first
        await worker._loop_task
        return second

    asyncio.run(asyncio.wait_for(play(), timeout=15))
    assert worker.stats["engine_calls"] == 1 and worker.stats["requests"] == 2
    assert worker.engine.stats["prefill_rows_computed"] == 2 and worker.engine.stats["joined_running"] == 0


def test_a_joiner_waits_batch_wait_ms_for_company_unless_the_room_fills(model_path):
    """What the engine thread takes between decode steps under `batch_wait_ms`."""
    worker = InferenceWorker(model_path, num_threads=1, batch_wait_ms=5_000)
    young = [req(f"y{i}", PROMPTS[0], i) for i in range(3)]
    for r in young:
        worker._pending.append((r, None, time.monotonic()))
    assert worker._take(4) == []  # 3 young requests, room for 4: wait for company
    assert worker._take(3) == young  # they fill the room
    old = req("o", PROMPTS[1], 9)
    worker._pending.append((old, None, time.monotonic() - 6.0))  # waited longer than 5 s
    assert worker._take(4) == [old] and worker._pending == []


def test_one_request_object_sent_twice_is_answered_twice(model_path):
    worker = InferenceWorker(model_path, num_threads=1)
    same = req("x", PROMPTS[0], 4, max_new_tokens=3)

    async def play():
        return await asyncio.gather(worker.generate(same), worker.generate(same))

    a, b = asyncio.run(asyncio.wait_for(play(), timeout=60))
    assert a.token_ids == b.token_ids and worker.stats["requests"] == 2
