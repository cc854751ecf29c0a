"""vLLM's continuation of a seeded request (roll/distributed/strategies/vllm_serve.py) without vLLM:
the generator-state hand-over runs against a stand-in for vLLM's model runner (the two attributes
the wrap touches: `requests[id].generator` and `_update_states`) with real torch generators, and
`serve`'s loop against a scripted engine. The same code on vLLM itself: test_vllm_partial.py
(the vllm lane)."""

from types import SimpleNamespace

import pytest
import torch

from roll.core.records import GenerateOutput, GenerateRequest, SamplingParams
from roll.distributed.strategies import vllm_serve
from roll.distributed.strategies.vllm_serve import RngResume, Running


class Runner:
    """vLLM's model runner as the wrap sees it: `_update_states` adds the scheduled new requests,
    each with a fresh generator seeded by its request's seed."""

    def __init__(self):
        self.requests: dict[str, SimpleNamespace] = {}
        self.scheduled: list[tuple[str, int]] = []

    def _update_states(self, scheduler_output=None):
        for engine_id, seed in self.scheduled:
            self.requests[engine_id] = SimpleNamespace(generator=torch.Generator().manual_seed(seed))
        self.scheduled = []


class LLM:
    def __init__(self):
        self.worker = SimpleNamespace(model_runner=Runner())

    def collective_rpc(self, fn, args=()):
        return [fn(self.worker, *args)]


def req(rid="a", seed=7, offset=0, greedy=False) -> GenerateRequest:
    params = SamplingParams(max_new_tokens=8, temperature=0.0 if greedy else 1.0)
    return GenerateRequest(rid, [2, 5], params, seed, sample_offset=offset)


def draws(generator: torch.Generator, n: int) -> list[float]:
    return torch.rand(n, generator=generator).tolist()


def test_a_continuation_draws_what_the_interrupted_request_would_have():
    llm = LLM()
    runner = llm.worker.model_runner
    rng = RngResume(llm)
    runner.scheduled = [("a-1", 7)]
    runner._update_states()
    first = runner.requests["a-1"].generator
    draws(first, 3)  # three tokens sampled
    uninterrupted = torch.Generator().manual_seed(7)
    draws(uninterrupted, 3)
    expected = draws(uninterrupted, 5)

    rng.save([Running(req(), "a-1", token_ids=[1, 2, 3])])
    state = rng.take(req(offset=3))
    rng.restore("a-2", state)
    runner.scheduled = [("a-2", 7)]  # the continuation: its generator starts from the seed again...
    runner._update_states()  # ...and the wrap sets the saved state before any sample
    assert draws(runner.requests["a-2"].generator, 5) == expected
    assert rng.saved == {} and runner.roll_pending_rng == {}


def test_the_hook_is_installed_once_and_other_requests_keep_their_seed():
    llm = LLM()
    RngResume(llm)
    RngResume(llm)  # a second engine object on the same runner: no second wrap
    runner = llm.worker.model_runner
    runner.scheduled = [("b-1", 11)]
    runner._update_states()
    assert draws(runner.requests["b-1"].generator, 2) == draws(torch.Generator().manual_seed(11), 2)


def test_greedy_and_fresh_requests_take_no_state_and_an_unknown_offset_is_refused():
    rng = RngResume(LLM())
    assert rng.take(req()) is None and rng.take(req(offset=4, greedy=True)) is None
    with pytest.raises(ValueError, match="only a request this engine interrupted can go on"):
        rng.take(req(offset=4))


def test_states_no_continuation_takes_are_dropped_oldest_first():
    llm = LLM()
    runner = llm.worker.model_runner
    rng = RngResume(llm, capacity=2)
    for i in range(3):
        runner.scheduled = [(f"r{i}-1", i)]
        runner._update_states()
        rng.save([Running(req(f"r{i}", seed=i), f"r{i}-1", token_ids=[9])])
    assert list(rng.saved) == [("r1", 1, 1), ("r2", 2, 1)]


class Engine:
    """A scripted vLLM engine: each step gives every running request one token (id 4, log-prob
    -1.0) and finishes it at its max_new_tokens."""

    def __init__(self):
        self.running: dict[str, int] = {}
        self.budget: dict[str, int] = {}
        self.aborted: list[str] = []

    def add_request(self, key, prompt, params):
        self.running[key], self.budget[key] = 0, params
        return key + "-internal"

    def abort_request(self, keys):
        self.aborted += keys
        for key in keys:
            self.running.pop(key)

    def step(self):
        outs = []
        for key in list(self.running):
            self.running[key] += 1
            done = self.running[key] >= self.budget[key]
            completion = SimpleNamespace(token_ids=[4], logprobs=[{4: SimpleNamespace(logprob=-1.0)}])
            completion.finish_reason = "length" if done else None
            outs.append(SimpleNamespace(request_id=key, outputs=[completion], finished=done, num_cached_tokens=0))
            if done:
                del self.running[key]
        return outs


class Strategy:
    def __init__(self):
        self.llm = SimpleNamespace(llm_engine=Engine(), collective_rpc=LLM().collective_rpc)
        self.rng = SimpleNamespace(take=lambda r: None, restore=lambda i, s: None, save=lambda rows: None)
        self.policy_version = 3
        self.stats = {"engine_steps": 0, "interrupted": 0}

    def _prompt(self, request):
        return request.prompt_ids

    def _sampling_params(self, request, stream):
        assert stream
        return request.params.max_new_tokens

    def step(self):
        return self.llm.llm_engine.step()

    def _answer(self, request, row, finish_reason):
        return GenerateOutput(request.request_id, row.token_ids, row.logprobs, finish_reason, self.policy_version)


def test_serve_answers_each_request_the_step_it_ends_and_returns_when_idle():
    strategy, delivered = Strategy(), []
    queue = [
        GenerateRequest(rid, [2], SamplingParams(max_new_tokens=n), 1) for rid, n in (("a", 2), ("b", 3), ("z", 0))
    ]

    def take(n):
        taken, queue[:] = queue[:n], queue[n:]
        return taken

    out = vllm_serve.serve(strategy, take, lambda r, o: delivered.append((r.request_id, o)), 8, lambda: False)
    assert out == [] and [rid for rid, _ in delivered] == ["z", "a", "b"]
    assert [len(o.token_ids) for _, o in delivered] == [0, 2, 3] and strategy.stats["engine_steps"] == 3


def test_an_interrupt_aborts_the_running_requests_and_hands_back_what_they_sampled():
    strategy, delivered = Strategy(), []
    queue = [GenerateRequest("a", [2], SamplingParams(max_new_tokens=10), 1)]
    engine = strategy.llm.llm_engine

    def take(n):
        taken, queue[:] = queue[:n], queue[n:]
        return taken

    interrupt = lambda: engine.running.get("a#0", 0) >= 3  # noqa: E731  (a weight update waits after 3 tokens)
    out = vllm_serve.serve(strategy, take, lambda r, o: delivered.append(o), 8, lambda: False, interrupt)
    assert delivered == [] and engine.aborted == ["a#0"] and engine.running == {}
    (suspended,) = out
    assert suspended.request.request_id == "a" and suspended.token_ids == [4] * 3
    assert suspended.logprobs == [-1.0] * 3 and strategy.stats["interrupted"] == 1
