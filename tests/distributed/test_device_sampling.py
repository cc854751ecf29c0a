"""Counter-based sampling on the device: the uniforms are a fixed function of (seed, counter),
computed here a second time in plain Python integers; tokens follow the distribution they should,
greedy and truncation behave as in hand-worked cases, and nothing depends on batch-mates."""

import math

import torch

from roll.core.records import GenerateRequest, SamplingParams
from roll.distributed.strategies.hf.device_sampling import SamplingState, counter_uniform, sample

M32 = 0xFFFFFFFF


def mix32_py(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x045D9F3B) & M32
    x ^= x >> 16
    x = (x * 0x045D9F3B) & M32
    return x ^ (x >> 16)


def uniform_py(seed: int, counter: int) -> float:
    h = mix32_py(seed & M32)
    h = mix32_py(h ^ ((seed >> 32) & M32) ^ 0x9E3779B9)
    h = mix32_py(h ^ (counter & M32))
    return (h >> 8) / 2**24


def state_for(params: list[dict], vocab: int, seeds: list[int]) -> SamplingState:
    reqs = [GenerateRequest(str(i), [1], SamplingParams(**p), s) for i, (p, s) in enumerate(zip(params, seeds))]
    return SamplingState.from_requests(reqs, vocab, torch.device("cpu"))


def test_uniforms_equal_the_pure_python_hash():
    seeds = [0, 1, 7, 2**31 - 1, 2**32 + 5, 2**62 + 12345]
    counters = [0, 1, 2, 1000, 2**20]
    s = torch.tensor([a for a in seeds for _ in counters])
    c = torch.tensor([b for _ in seeds for b in counters])
    got = counter_uniform(s, c).tolist()
    want = [uniform_py(a, b) for a in seeds for b in counters]
    assert got == want
    assert all(0.0 <= u < 1.0 for u in got)


def test_uniforms_look_uniform_and_independent_across_seeds():
    seeds = torch.arange(4096).repeat_interleave(16)
    counters = torch.arange(16).repeat(4096)
    u = counter_uniform(seeds, counters)
    assert abs(u.mean().item() - 0.5) < 0.01 and abs(u.var().item() - 1 / 12) < 0.005
    hist = torch.histc(u, bins=16, min=0, max=1)
    assert (hist - len(u) / 16).abs().max().item() < 5 * math.sqrt(len(u) / 16)  # within 5 sigma per bin
    a, b = u.view(4096, 16)[:, 0], u.view(4096, 16)[:, 1]  # neighbouring counters of a seed
    assert abs(torch.corrcoef(torch.stack([a, b]))[0, 1].item()) < 0.05


def test_sampled_tokens_follow_the_distribution():
    probs = torch.tensor([0.5, 0.25, 0.125, 0.125])
    n = 8000
    logits = probs.log().expand(n, 4)
    state = state_for([{"temperature": 1.0}] * n, 4, list(range(n)))
    tokens, logprobs = sample(logits, state, torch.zeros(n, dtype=torch.long), truncate=False)
    freq = torch.bincount(tokens, minlength=4).float() / n
    assert (freq - probs).abs().max().item() < 0.02
    torch.testing.assert_close(logprobs, probs.log()[tokens])


def test_greedy_rows_take_the_argmax_and_report_untempered_logprobs():
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]])
    state = state_for([{"do_sample": False}, {"temperature": 0.5}], 3, [1, 2])
    tokens, logprobs = sample(logits, state, torch.zeros(2, dtype=torch.long), truncate=False)
    assert tokens[0].item() == 1
    torch.testing.assert_close(logprobs[0], torch.log_softmax(logits[0], -1)[1])
    torch.testing.assert_close(logprobs[1], torch.log_softmax(logits[1] / 0.5, -1)[tokens[1]])


def test_truncation_by_hand():
    # probabilities 0.4, 0.3, 0.2, 0.1: top_k=2 keeps {0, 1}; top_p=0.6 keeps {0, 1} (0.4 < 0.6 <= 0.7);
    # top_p=0.3 keeps {0} only (the first token is always kept)
    logits = torch.tensor([0.4, 0.3, 0.2, 0.1]).log().expand(3 * 2000, 4)
    params = [{"top_k": 2}, {"top_p": 0.6}, {"top_p": 0.3}]
    rows = [p for p in params for _ in range(2000)]
    state = state_for(rows, 4, list(range(len(rows))))
    tokens, logprobs = sample(logits, state, torch.zeros(len(rows), dtype=torch.long), truncate=True)
    by_setting = tokens.view(3, 2000)
    assert set(by_setting[0].tolist()) == {0, 1} and set(by_setting[1].tolist()) == {0, 1}
    assert set(by_setting[2].tolist()) == {0}
    assert abs((by_setting[0] == 0).float().mean().item() - 4 / 7) < 0.04  # 0.4 / (0.4 + 0.3)
    torch.testing.assert_close(logprobs, torch.tensor([0.4, 0.3, 0.2, 0.1]).log()[tokens])  # untruncated


def test_a_row_draws_the_same_token_whatever_its_batch_mates():
    torch.manual_seed(0)
    logits = torch.randn(5, 50)
    params = [{"temperature": 0.9, "top_p": 0.95}, {"temperature": 1.0}, {"top_k": 5}, {"do_sample": False}, {}]
    seeds = [3, 99, 4, 5, 6]
    counters = torch.tensor([0, 7, 2, 1, 3])
    state = state_for(params, 50, seeds)
    together, _ = sample(logits, state, counters, truncate=True)
    for i in range(5):
        alone, _ = sample(logits[i : i + 1], state_for([params[i]], 50, [seeds[i]]), counters[i : i + 1], True)
        assert alone.item() == together[i].item()
