"""The hf engine: per-request seeded sampling, exact log-probs, stop and length handling."""

import pytest
import torch

from roll.agentic.rollout.records import GenerateRequest, SamplingParams
from roll.distributed.strategies.hf_infer import HFInferStrategy
from roll.models.loading import load_causal_lm, load_tokenizer
from roll.models.tiny import build_tiny_model


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = build_tiny_model(str(tmp_path_factory.mktemp("tiny") / "m"), corpus=["You are P."], seed=3)
    tok = load_tokenizer(path)
    model = load_causal_lm(path)
    return HFInferStrategy(model, pad_token_id=tok.pad_token_id, eos_token_ids=[tok.eos_token_id]), tok


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
    outs = strategy.generate_batch([req(str(i), p, seed=i, temperature=temperature, max_new_tokens=8)
                                    for i, p in enumerate(PROMPTS)])
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
    ref = strategy.model.generate(torch.tensor([PROMPTS[2]]), max_new_tokens=8, do_sample=False,
                                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    expected = ref[0, len(PROMPTS[2]):].tolist()
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


def test_top_k_one_is_greedy(engine):
    strategy, _ = engine
    greedy = strategy.generate_batch([req("g", PROMPTS[0], seed=1, do_sample=False, max_new_tokens=6)])[0]
    top1 = strategy.generate_batch([req("k", PROMPTS[0], seed=9, top_k=1, max_new_tokens=6)])[0]
    assert top1.token_ids == greedy.token_ids
