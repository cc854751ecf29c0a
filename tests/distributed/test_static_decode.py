"""Static decode slots: the same tokens and log-probs as the dynamic-cache loop, in batch and
continuous mode, when slots grow in the middle of a run, and (on CUDA) when the step is replayed
as a graph."""

import pytest
import torch

from roll.core.records import GenerateRequest, SamplingParams
from roll.distributed.strategies.hf.continuous import serve
from roll.distributed.strategies.hf.infer import HFInferStrategy
from roll.distributed.strategies.hf.static_decode import DecodeSlots, bucket, supports
from roll.models.loading import load_causal_lm, load_tokenizer
from roll.models.tiny import build_tiny_model


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model_path(tmp_path_factory, request):
    path = str(tmp_path_factory.mktemp("tiny") / request.param)
    return build_tiny_model(path, corpus=["You are P."], seed=3, arch=request.param)


def engines(model_path):
    tok = load_tokenizer(model_path)
    model = load_causal_lm(model_path)
    make = lambda static: HFInferStrategy(  # noqa: E731
        model, pad_token_id=tok.pad_token_id, eos_token_ids=[tok.eos_token_id], static_decode=static
    )
    return make(True), make(False)


def req(rid, prompt, seed, session=None, **kw):
    params = dict(max_new_tokens=6, temperature=0.9)
    params.update(kw)
    return GenerateRequest(rid, prompt, SamplingParams(**params), seed, session_id=session)


PROMPTS = [[2, 5, 9, 11], [2, 7], [2, 5, 5, 5, 5, 5, 9, 12, 13], [3, 4, 8], [2, 6, 6, 7, 10]]


def assert_same(got, want):
    assert got.token_ids == want.token_ids and got.finish_reason == want.finish_reason
    torch.testing.assert_close(torch.tensor(got.logprobs), torch.tensor(want.logprobs), atol=1e-5, rtol=0)


def test_bucket_is_the_next_power_of_two():
    assert [bucket(n) for n in (1, 2, 3, 5, 32, 33)] == [1, 2, 4, 8, 32, 64]
    assert bucket(10, minimum=256) == 256 and bucket(300, minimum=256) == 512


def test_the_tiny_architectures_are_supported(model_path):
    assert supports(load_causal_lm(model_path))


def test_batch_mode_equals_the_dynamic_loop(model_path):
    slots, dynamic = engines(model_path)
    reqs = [
        req(str(i), p, seed=i, top_p=0.9 if i == 2 else 1.0, max_new_tokens=4 + 3 * i) for i, p in enumerate(PROMPTS)
    ]
    reqs.append(req("g", PROMPTS[0], seed=0, do_sample=False, max_new_tokens=9))
    for got, want in zip(slots.generate_batch(reqs), dynamic.generate_batch(reqs), strict=True):
        assert_same(got, want)
    assert slots.stats["decode_steps"] == dynamic.stats["decode_steps"]


def test_continuous_arrivals_grow_the_slots_and_keep_every_token(model_path):
    slots, dynamic = engines(model_path)
    arrivals = {
        0: [req("a", PROMPTS[0], 1, max_new_tokens=30)],
        2: [req(f"b{i}", PROMPTS[i % 5], 10 + i) for i in range(3)],
    }
    arrivals[5] = [req(f"c{i}", PROMPTS[i % 5] * 30, 20 + i, max_new_tokens=12) for i in range(4)]  # long prompts

    def run(engine):
        looks, answers = [0], {}

        def take(n):
            batch = arrivals.get(looks[0], [])[:n]
            looks[0] += 1
            return batch

        serve(engine, take, lambda r, o: answers.__setitem__(r.request_id, o), 64, lambda: False)
        return answers

    got, want = run(slots), run(dynamic)
    assert sorted(got) == sorted(want) and len(got) == 8
    for rid in got:
        assert_same(got[rid], want[rid])
    sizes = [(s.size, s.length) for s in slots.slot_pool.entries]
    # grew from (1, 128) to 8 rows of 384 columns (up to 9 * 30 prompt ids + 12 new), then shrank as rows left
    assert sizes[0] == (1, 128) and (8, 384) in sizes and sizes[-1][0] < 8


def test_sessions_reuse_the_kv_the_slots_stored(model_path):
    slots, dynamic = engines(model_path)
    first = [req(f"s{i}", p, i, session=f"s{i}") for i, p in enumerate(PROMPTS)]
    outs = [e.generate_batch(first) for e in (slots, dynamic)]
    second = [
        req(f"s{i}/2", p + o.token_ids + [5, 6], 100 + i, session=f"s{i}")
        for i, (p, o) in enumerate(zip(PROMPTS, outs[0]))
    ]
    got, want = slots.generate_batch(second), dynamic.generate_batch(second)
    for g, w in zip(got, want, strict=True):
        assert_same(g, w)
    assert slots.stats["prefix_tokens_reused"] == dynamic.stats["prefix_tokens_reused"] > 0


def test_rows_without_a_session_gather_no_kv_when_they_finish(model_path, monkeypatch):
    slots, _ = engines(model_path)
    gathered = []
    row_kv = DecodeSlots.row_kv
    monkeypatch.setattr(DecodeSlots, "row_kv", lambda self, *a: gathered.append(a) or row_kv(self, *a))
    slots.generate_batch([req(str(i), p, i) for i, p in enumerate(PROMPTS)])
    assert gathered == []  # nothing would keep it
    slots.generate_batch([req("s", PROMPTS[0], 0, session="s")])
    assert len(gathered) == 1


def test_offload_drops_the_slots(model_path):
    slots, _ = engines(model_path)
    slots.generate_batch([req("a", PROMPTS[0], 1)])
    assert slots.slot_pool.entries
    slots.offload("cpu")
    slots.reload()
    assert not slots.slot_pool.entries
    assert len(slots.generate_batch([req("a", PROMPTS[0], 1)])[0].token_ids) == 6


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_graph_replay_equals_the_eager_step(model_path):
    tok = load_tokenizer(model_path)
    model = load_causal_lm(model_path).to("cuda")
    make = lambda: HFInferStrategy(model, pad_token_id=tok.pad_token_id, eos_token_ids=[])  # noqa: E731  every row runs 20 steps
    graphed, eager = make(), make()
    reqs = [req(str(i), p, seed=i, max_new_tokens=20, top_k=5 if i == 1 else 0) for i, p in enumerate(PROMPTS)]
    got = graphed.generate_batch(reqs)
    assert all(s.use_graphs and s._graphs for s in graphed.slot_pool.entries)
    original = DecodeSlots.__init__

    def no_graphs(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.use_graphs = False

    DecodeSlots.__init__ = no_graphs
    try:
        want = eager.generate_batch(reqs)
    finally:
        DecodeSlots.__init__ = original
    for g, w in zip(got, want, strict=True):
        assert_same(g, w)
