"""The hf engine: per-request seeded sampling, exact log-probs, stop and length handling, and
multi-turn KV reuse that gives the same tokens and log-probs as recomputing every prompt."""

import asyncio

import pytest
import torch

import envs  # noqa: F401  (registers the built-in envs)
from roll.agentic.env_manager.traj_env_manager import TrajEnvManager
from roll.agentic.episode import EnvSpec, EpisodeSpec
from roll.core.records import GenerateRequest, SamplingParams
from roll.distributed.strategies.hf.infer import HFInferStrategy
from roll.distributed.strategies.hf.kv_cache import (
    Prefix,
    SessionKVCache,
    left_padded_past,
)
from roll.distributed.workers.inference import InferenceWorker
from roll.models.loading import load_causal_lm, load_tokenizer
from roll.models.tiny import build_tiny_model


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return build_tiny_model(str(tmp_path_factory.mktemp("tiny") / "m"), corpus=["You are P."], seed=3)


@pytest.fixture(scope="module", params=[True, False], ids=["slots", "dynamic"])
def engine(model_path, request):
    """The engine on static decode slots (the default for this architecture) and on the dynamic-cache loop."""
    tok = load_tokenizer(model_path)
    model = load_causal_lm(model_path)
    strategy = HFInferStrategy(
        model, pad_token_id=tok.pad_token_id, eos_token_ids=[tok.eos_token_id], static_decode=request.param
    )
    return strategy, tok


def req(rid, prompt, seed, **kw):
    params = dict(max_new_tokens=6, temperature=1.0)
    params.update(kw)
    return GenerateRequest(rid, prompt, SamplingParams(**params), seed)


PROMPTS = [[2, 5, 9, 11], [2, 7], [2, 5, 5, 5, 5, 5, 9, 12, 13]]


def test_same_seed_same_tokens_whatever_the_batch(engine):
    strategy, _ = engine
    alone = strategy.generate_batch([req("a", PROMPTS[0], seed=11)])[0]
    mixed = strategy.generate_batch([req("b", PROMPTS[1], 5), req("a", PROMPTS[0], 11), req("c", PROMPTS[2], 6)])
    assert mixed[1].token_ids == alone.token_ids
    torch.testing.assert_close(torch.tensor(mixed[1].logprobs), torch.tensor(alone.logprobs), atol=1e-5, rtol=0)
    other = strategy.generate_batch([req("a", PROMPTS[0], seed=12, max_new_tokens=20)])[0]
    longer = strategy.generate_batch([req("a", PROMPTS[0], seed=11, max_new_tokens=20)])[0]
    assert other.token_ids != longer.token_ids  # a different seed samples differently


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_a_full_forward(engine, temperature):
    strategy, _ = engine
    outs = strategy.generate_batch(
        [req(str(i), p, seed=i, temperature=temperature, max_new_tokens=8) for i, p in enumerate(PROMPTS)]
    )
    for prompt, out in zip(PROMPTS, outs):
        ids = torch.tensor([prompt + out.token_ids])
        logits = strategy.model(input_ids=ids).logits[0].float() / temperature
        lp = torch.log_softmax(logits, -1)
        n = len(prompt)
        expected = [lp[n - 1 + k, tok].item() for k, tok in enumerate(out.token_ids)]
        torch.testing.assert_close(torch.tensor(out.logprobs), torch.tensor(expected), atol=1e-4, rtol=0)


def test_greedy_matches_transformers_generate(engine):
    strategy, tok = engine
    out = strategy.generate_batch([req("g", PROMPTS[2], seed=0, do_sample=False, max_new_tokens=8)])[0]
    ref = strategy.model.generate(
        torch.tensor([PROMPTS[2]]),
        max_new_tokens=8,
        do_sample=False,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    expected = ref[0, len(PROMPTS[2]) :].tolist()
    assert out.token_ids == expected[: len(out.token_ids)]
    assert out.finish_reason == ("stop" if out.token_ids[-1] == tok.eos_token_id else "length")


def test_stop_tokens_and_length(engine):
    strategy, _ = engine
    free = strategy.generate_batch([req("x", PROMPTS[0], seed=4, max_new_tokens=12)])[0]
    stop_at = free.token_ids[2]
    first = free.token_ids.index(stop_at)
    stopped = strategy.generate_batch([req("x", PROMPTS[0], seed=4, max_new_tokens=12, stop_token_ids=[stop_at])])[0]
    assert stopped.token_ids == free.token_ids[: first + 1]
    assert stopped.finish_reason == "stop"
    short = strategy.generate_batch([req("y", PROMPTS[1], seed=4, max_new_tokens=1)])[0]
    assert len(short.token_ids) == 1


def test_ignore_eos_goes_on_past_the_end_of_text_token(engine):
    """The EOS the engine stops on becomes an ordinary token: the same tokens up to it, then
    more, up to the length (a benchmark's fixed response lengths)."""
    strategy, tok = engine
    eos = tok.eos_token_id
    ended = [
        (seed, out)
        for seed in range(40)
        for out in strategy.generate_batch([req("e", PROMPTS[0], seed=seed, max_new_tokens=64)])
        if out.finish_reason == "stop" and len(out.token_ids) < 64
    ]
    seed, out = ended[0]  # premise: some seed ends early on the EOS
    assert out.token_ids[-1] == eos
    longer = strategy.generate_batch([req("e", PROMPTS[0], seed=seed, max_new_tokens=64, ignore_eos=True)])[0]
    assert longer.token_ids[: len(out.token_ids)] == out.token_ids
    assert len(longer.token_ids) == 64 and longer.finish_reason == "length"
    stopped = strategy.generate_batch(
        [req("e", PROMPTS[0], seed=seed, max_new_tokens=64, ignore_eos=True, stop_token_ids=[eos])]
    )[0]
    assert stopped.token_ids == out.token_ids  # a stop id still stops it


def test_top_k_one_is_greedy(engine):
    strategy, _ = engine
    greedy = strategy.generate_batch([req("g", PROMPTS[0], seed=1, do_sample=False, max_new_tokens=6)])[0]
    top1 = strategy.generate_batch([req("k", PROMPTS[0], seed=9, top_k=1, max_new_tokens=6)])[0]
    assert top1.token_ids == greedy.token_ids


# ---- multi-turn prefix caching (hf/kv_cache.py) ----

FIRST_PROMPTS = [[2, 5, 9], [2, 7, 7, 8, 9, 10, 11, 12], [2, *range(5, 16)], [2, 6, 6, 6, 6], [2, *range(20, 39)]]
MAX_NEW = [1, 2, 4, 6, 3]


def observation(turn, i):
    """Scripted ids appended after turn `turn` of conversation i: 1 to 7 ids, varying per row."""
    return [5 + (i + k) % 9 for k in range(1 + (3 * i + turn) % 7)]


def engine_on(model, tok, max_cached_tokens=10_000, static_decode=None):
    return HFInferStrategy(
        model,
        pad_token_id=tok.pad_token_id,
        eos_token_ids=[tok.eos_token_id],
        max_cached_tokens=max_cached_tokens,
        static_decode=static_decode,
    )


def converse(strategy, turns=3):
    """Five conversations, one engine call per turn; returns (prompts, outputs) per turn."""
    prompts, history = [list(p) for p in FIRST_PROMPTS], []
    for turn in range(turns):
        reqs = [
            GenerateRequest(
                f"s{i}/{turn}",
                prompts[i],
                SamplingParams(max_new_tokens=MAX_NEW[i], temperature=0.8),
                seed=10 * i + turn,
                session_id=f"s{i}",
            )
            for i in range(len(prompts))
        ]
        outs = strategy.generate_batch(reqs)
        history.append((prompts, outs))
        prompts = [p + o.token_ids + observation(turn, i) for i, (p, o) in enumerate(zip(prompts, outs))]
    return history


def assert_same_outputs(got, want):
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids and g.finish_reason == w.finish_reason
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=1e-5, rtol=0)


def test_multi_turn_reuse_matches_recompute(engine):
    strategy, tok = engine
    cached, fresh = (
        engine_on(strategy.model, tok, static_decode=strategy.static_decode),
        engine_on(strategy.model, tok, max_cached_tokens=0, static_decode=strategy.static_decode),
    )
    with_reuse, without = converse(cached), converse(fresh)
    reused_per_turn = []
    for (prompts, outs), (prompts_ref, outs_ref) in zip(with_reuse, without):
        assert prompts == prompts_ref
        assert_same_outputs(outs, outs_ref)
    for prev_prompts, prev_outs in with_reuse[:-1]:
        # a turn reuses everything the last turn fed: its prompt and its output but the last id
        reused_per_turn.append(sum(len(p) + len(o.token_ids) - 1 for p, o in zip(prev_prompts, prev_outs)))
    total_prompt = sum(len(p) for prompts, _ in with_reuse for p in prompts)
    tokens = ("prefix_tokens_reused", "prefill_tokens")
    assert {k: cached.stats[k] for k in tokens} == {
        "prefix_tokens_reused": sum(reused_per_turn),
        "prefill_tokens": total_prompt - sum(reused_per_turn),
    }
    assert {k: fresh.stats[k] for k in tokens} == {"prefix_tokens_reused": 0, "prefill_tokens": total_prompt}
    prompts, outs = with_reuse[-1]  # and the last turn agrees with one plain forward per row
    for prompt, out in zip(prompts, outs):
        lp = torch.log_softmax(strategy.model(input_ids=torch.tensor([prompt + out.token_ids])).logits[0] / 0.8, -1)
        expected = [lp[len(prompt) - 1 + k, t].item() for k, t in enumerate(out.token_ids)]
        torch.testing.assert_close(torch.tensor(out.logprobs), torch.tensor(expected), atol=1e-4, rtol=0)


def test_diverging_prompts_reuse_only_the_common_prefix(engine):
    strategy, tok = engine
    cached, fresh = (
        engine_on(strategy.model, tok, static_decode=strategy.static_decode),
        engine_on(strategy.model, tok, max_cached_tokens=0, static_decode=strategy.static_decode),
    )
    a, b, r = [2, 5, 9, 11, 7, 7, 8, 9, 10], [2, 6, 7, 8], [2, 8, 8, 9, 5, 6]
    first = [req("a", a, 1, max_new_tokens=3), req("b", b, 2, max_new_tokens=2), req("r", r, 3, max_new_tokens=1)]
    for q in first:
        q.session_id = q.request_id
    outs = cached.generate_batch(first)
    assert cached.kv_cache.num_tokens == (9 + 2) + (4 + 1) + 6
    b_next = b + outs[1].token_ids + [5, 5]
    second = [
        req("a", a[:4] + [12, 13], 4),
        req("b", b_next, 5),
        req("r", r, 3, max_new_tokens=1),
        req("z", [3] + a[1:], 6),
        req("n", [2, 9, 9], 7),
    ]
    for q, sid in zip(second, ["a", "b", "r", "a", None]):
        q.session_id = sid
    before = dict(cached.stats)
    assert_same_outputs(cached.generate_batch(second), fresh.generate_batch(second))
    # a: diverges at index 4; b: extends (4 + 2 - 1 fed); r: identical prompt, all but its last id;
    # z: first id differs from a's cache; n: no session
    assert cached.stats["prefix_tokens_reused"] - before["prefix_tokens_reused"] == 4 + 5 + 5 + 0 + 0


def test_load_weights_clears_the_session_cache(engine):
    strategy, tok = engine
    cached = engine_on(strategy.model, tok, static_decode=strategy.static_decode)
    converse(cached, turns=1)
    assert len(cached.kv_cache) == 5
    cached.load_weights(strategy.model.state_dict(), version=3)
    assert len(cached.kv_cache) == 0 and cached.kv_cache.num_tokens == 0
    out = cached.generate_batch([req("s0/1", FIRST_PROMPTS[0] + [5, 6], 1)])[0]
    assert cached.stats["prefix_tokens_reused"] == 0 and out.policy_version == 3


def test_lru_bound_evicts_least_recently_used_sessions(engine):
    strategy, tok = engine
    cached = engine_on(strategy.model, tok, max_cached_tokens=20, static_decode=strategy.static_decode)
    prompts = {s: [2, *range(5 + k, 12 + k)] for k, s in enumerate("abc")}  # 8 ids each
    reqs = [req(s, p, 1, do_sample=False, max_new_tokens=1) for s, p in prompts.items()]
    for q in reqs:
        q.session_id = q.request_id
    outs = cached.generate_batch(reqs)
    assert cached.kv_cache.session_ids() == ["b", "c"] and cached.kv_cache.num_tokens == 16  # a: 24 > 20
    nxt = [
        req(s, prompts[s] + outs[k].token_ids + [5], 2, do_sample=False, max_new_tokens=1) for k, s in enumerate("ab")
    ]
    for q in nxt:
        q.session_id = q.request_id
    cached.generate_batch(nxt)
    assert cached.stats["prefix_tokens_reused"] == 0 + 8  # a was evicted, b reuses its 8 ids
    # the lookup touched b; storing a (10 ids) evicts c, then b (10 ids) replaces its 8
    assert cached.kv_cache.session_ids() == ["a", "b"] and cached.kv_cache.num_tokens == 20
    assert cached.release("a") and not cached.release("a") and cached.kv_cache.num_tokens == 10


def test_traj_env_manager_sends_its_trajectory_id_as_session(engine):
    strategy, tok = engine
    cached, fresh = (
        engine_on(strategy.model, tok, static_decode=strategy.static_decode),
        engine_on(strategy.model, tok, max_cached_tokens=0, static_decode=strategy.static_decode),
    )
    spec = EnvSpec(
        tag="FrozenLake",
        env_type="frozen_lake",
        env_config={"max_path_length": 8},
        max_steps=3,
        max_tokens_per_step=2,
        response_prefix="<answer>",
    )
    trajectories, requests = [], []
    for strat in (cached, fresh):

        async def generate(request, strat=strat):
            requests.append(request)
            return strat.generate_batch([request])[0]

        manager = TrajEnvManager(spec, tok, generate, SamplingParams(), sequence_length=4096)
        trajectories.append(asyncio.run(manager.run_episode(EpisodeSpec("g", "g-0", env_seed=1, sample_seed=2))))
    assert {r.session_id for r in requests} == {"g-0"}
    assert trajectories[0].token_ids == trajectories[1].token_ids
    torch.testing.assert_close(
        torch.tensor(trajectories[0].infer_logprobs), torch.tensor(trajectories[1].infer_logprobs), atol=1e-5, rtol=0
    )
    turns = requests[: len(requests) // 2]
    ends = trajectories[0].turn_end_positions
    # turn k reuses every id up to (not including) turn k-1's last generated id
    assert cached.stats["prefix_tokens_reused"] == sum(ends[: len(turns) - 1])
    assert len(turns) == trajectories[0].num_actions == 3  # invalid answers: the episode runs all 3 turns


def kv_span(first, last):
    """A one-layer chunk whose key at position t is t and value is -t: (T, H_kv=1, D=1)."""
    keys = torch.arange(float(first), float(last)).view(-1, 1, 1)
    return [(keys, -keys)]


def test_session_cache_matches_the_common_prefix_across_chunks():
    cache = SessionKVCache(max_cached_tokens=6)
    turn0, turn1 = kv_span(0, 3), kv_span(3, 5)
    cache.store("s", [2, 4, 6, 8, 10], [turn0, turn1])
    prefix = cache.match("s", [2, 4, 6, 9, 9])  # diverges at a chunk boundary: reused as is
    assert prefix.length == 3 and prefix.chunks == [turn0]
    prefix = cache.match("s", [2, 4, 6, 8, 10])  # identical: all but the last id, which is fed
    assert prefix.length == 4 and prefix.chunks[0] is turn0
    assert prefix.chunks[1][0][0].flatten().tolist() == [3.0] and prefix.chunks[1][0][1].flatten().tolist() == [-3.0]
    assert cache.match("other", [2, 4]).length == 0 and cache.match(None, [2, 4]).length == 0
    assert cache.match("s", [3, 4, 6]).length == 0
    cache.store("t", list(range(7)), [kv_span(0, 7)])  # over the bound: not kept, evicts nothing
    assert cache.session_ids() == ["s"] and cache.num_tokens == 5


def test_left_padded_past_right_aligns_each_row():
    rows = [Prefix(2, [kv_span(0, 1), kv_span(1, 2)]), Prefix(), Prefix(3, [kv_span(5, 8)])]
    [(keys, values)] = left_padded_past(rows)
    assert keys.shape == (3, 1, 3, 1)  # (B, H_kv, P, D)
    assert keys.flatten().tolist() == [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 5.0, 6.0, 7.0]
    assert values.flatten().tolist() == [-0.0, -0.0, -1.0, 0.0, 0.0, 0.0, -5.0, -6.0, -7.0]


def test_inference_worker_counts_reused_and_prefilled_ids(model_path):
    worker = InferenceWorker(model_path, num_threads=1, max_cached_tokens=100)
    first = req("c/0", [2, 5, 9, 11], 1, max_new_tokens=3)
    first.session_id = "c"

    async def play():
        out = await worker.generate(first)
        second = req("c/1", first.prompt_ids + out.token_ids + [5, 6], 2, max_new_tokens=1)
        second.session_id = "c"
        await worker.generate(second)
        return out, worker.get_stats(), worker.release_session("c"), worker.get_stats()

    out, stats, released, after = asyncio.run(play())
    fed = 4 + len(out.token_ids) - 1  # the first turn's prompt and its output but the last id
    assert (stats["prefix_tokens_reused"], stats["prefill_tokens"]) == (fed, 4 + (4 + len(out.token_ids) + 2 - fed))
    assert stats["kv_cached_tokens"] == 4 + len(out.token_ids) + 2  # second turn: prompt, 1 id generated
    assert released and after["kv_cached_tokens"] == 0


def test_identical_prompts_are_prefilled_once(engine):
    strategy, _ = engine
    before = strategy.stats.get("prefill_rows_computed", 0)
    reqs = [req(str(i), PROMPTS[i % 2], seed=i, max_new_tokens=4) for i in range(6)]
    together = strategy.generate_batch(reqs)
    assert strategy.stats["prefill_rows_computed"] - before == 2  # two distinct prompts for six rows
    for r, out in zip(reqs, together):  # each row is what it would be alone
        alone = strategy.generate_batch([r])[0]
        assert out.token_ids == alone.token_ids
        torch.testing.assert_close(torch.tensor(out.logprobs), torch.tensor(alone.logprobs), atol=1e-5, rtol=0)


def test_a_weight_update_lets_the_running_batch_finish_then_drops_session_kv(model_path):
    """Async training's sync policy: a batch already in the engine finishes on the old weights
    (and stores its session's KV); the update then clears that KV, so the session's next turn is
    prefilled from scratch under the new weights instead of reusing stale keys and values."""
    worker = InferenceWorker(model_path, num_threads=1, max_cached_tokens=1000)
    first = req("c/0", [2, 5, 9, 11], 1, max_new_tokens=6)
    first.session_id = "c"

    async def play():
        turn = asyncio.create_task(worker.generate(first))
        while worker._engine_lock is None or not worker._engine_lock.locked():  # the batch is running
            await asyncio.sleep(0)
        weights = {k: v.clone() for k, v in worker.engine.model.state_dict().items()}
        await worker.update_weights(weights, version=1)
        out, after_update = await turn, worker.get_stats()
        second = req("c/1", first.prompt_ids + out.token_ids + [5, 6], 2, max_new_tokens=1)
        second.session_id = "c"
        return out, after_update, await worker.generate(second), worker.get_stats()

    out, after_update, out2, final = asyncio.run(play())
    assert out.policy_version == 0 and out2.policy_version == 1
    assert after_update["kv_cached_tokens"] == 0 and after_update["policy_version"] == 1
    # nothing of the old weights' KV was reused: the second turn's prompt was prefilled whole
    assert final["prefix_tokens_reused"] == 0
    assert final["prefill_tokens"] == len(first.prompt_ids) + len(first.prompt_ids + out.token_ids + [5, 6])


def test_inference_worker_loads_the_attention_it_is_given(model_path):
    """`actor_infer.model_args.attn_implementation` reaches the engine's model; sdpa (transformers'
    choice here) becomes the engine's grouped-query decode attention, eager stays eager."""
    eager = InferenceWorker(model_path, attn_implementation="eager")
    assert eager.engine.model.config._attn_implementation == "eager" and eager.engine.static_decode
    default = InferenceWorker(model_path)
    assert default.engine.model.config._attn_implementation == "roll_sdpa"
