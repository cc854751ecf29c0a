"""Continuous serving on vLLM's engine, step by step, with interruption at a token boundary.

`serve` is the `vllm` strategy's counterpart of `hf`'s `continuous.serve`, with the same contract
for the inference worker: before each engine step it admits up to `max_rows - running` new
requests from `take`; each request is answered through `deliver` the step it finishes; once
`stop_admitting()` is true no request is taken and the call returns when the running ones are done;
once `interrupt()` is true (partial rollout) the call returns before the next step with every
running request aborted in the engine and handed back as `Suspended` (the ids and log-probs it
sampled so far). It runs on the thread that built the engine and calls vLLM there directly.

A continuation (`GenerateRequest.sample_offset` > 0, made by `roll.distributed.workers.partial`)
samples on from where its request stopped: at the interruption the request's random generator
state is read from vLLM's model runner, and it is set on the continuation's generator before that
request's first sample (`RngResume`, a wrap of the runner's `_update_states`, in-process). So
under unchanged weights a continued request samples exactly the uninterrupted one's ids. The
continued prefix is prefilled again: its KV is recomputed under the new weights (a weight load
drops vLLM's prefix cache).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from roll.core.records import GenerateOutput, GenerateRequest
from roll.distributed.strategies.engine_api import Suspended

Take = Callable[[int], list[GenerateRequest]]
Deliver = Callable[[GenerateRequest, GenerateOutput], None]


@dataclass
class Running:
    """One request in the engine: its vLLM id and what it has sampled so far."""

    request: GenerateRequest
    engine_id: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    cached_prompt_tokens: int | None = None


class RngResume:
    """The random generator states of interrupted requests, to go on where each stopped.

    Keyed by (request id, seed, index of the next token to sample): the continuation of a request
    carries that index as its `sample_offset`. At most `capacity` states are kept, the oldest
    dropped first: under `partial_rollout: abort` no continuation ever takes them."""

    def __init__(self, llm: Any, capacity: int = 4096):
        self.llm = llm
        self.capacity = capacity
        self.saved: OrderedDict[tuple[str, int, int], Any] = OrderedDict()
        llm.collective_rpc(_install_rng_hook)

    def save(self, rows: list[Running]) -> None:
        """Read the generators of `rows` (seeded sampling only) before they are aborted."""
        states = self.llm.collective_rpc(_generator_states, args=([row.engine_id for row in rows],))[0]
        for row in rows:
            if row.engine_id in states:
                r = row.request
                self.saved[r.request_id, r.seed, r.sample_offset + len(row.token_ids)] = states[row.engine_id]
        while len(self.saved) > self.capacity:
            self.saved.popitem(last=False)

    def take(self, request: GenerateRequest) -> Any | None:
        """The generator state a continuation starts in (None: a request from the start, or
        greedy). A request with an offset this engine did not interrupt is refused: its stream
        cannot be found."""
        if request.sample_offset == 0 or request.params.greedy:
            return None
        key = (request.request_id, request.seed, request.sample_offset)
        if key not in self.saved:
            raise ValueError(
                f"vllm: request {request.request_id} asks to sample from index {request.sample_offset} of its "
                "seed's stream, and only a request this engine interrupted can go on (partial rollout)"
            )
        return self.saved.pop(key)

    def restore(self, engine_id: str, state: Any | None) -> None:
        """Set `state` on the generator of the request vLLM runs as `engine_id`, before its first sample."""
        if state is not None:
            self.llm.collective_rpc(_set_pending_state, args=(engine_id, state))

    def clear(self) -> None:
        self.saved.clear()


def _install_rng_hook(worker: Any) -> None:
    """In vLLM's worker: after the runner adds new requests (`_update_states`), set the saved
    generator state of each continuation added, before its first sample."""
    runner = worker.model_runner
    if hasattr(runner, "roll_pending_rng"):
        return
    runner.roll_pending_rng = {}
    update_states = runner._update_states

    def with_saved_states(*args: Any, **kwargs: Any) -> Any:
        result = update_states(*args, **kwargs)
        for engine_id in [i for i in runner.roll_pending_rng if i in runner.requests]:
            state = runner.roll_pending_rng.pop(engine_id)
            generator = runner.requests[engine_id].generator
            if generator is not None:
                generator.set_state(state)
        return result

    runner._update_states = with_saved_states


def _generator_states(worker: Any, engine_ids: list[str]) -> dict[str, Any]:
    requests = worker.model_runner.requests
    return {
        i: requests[i].generator.get_state() for i in engine_ids if i in requests and requests[i].generator is not None
    }


def _set_pending_state(worker: Any, engine_id: str, state: Any) -> None:
    worker.model_runner.roll_pending_rng[engine_id] = state


def serve(
    strategy: Any,
    take: Take,
    deliver: Deliver,
    max_rows: int,
    stop_admitting: Callable[[], bool],
    interrupt: Callable[[], bool] = lambda: False,
) -> list[Suspended]:
    """See the module docstring; `strategy` is a `VLLMInferStrategy`, called on its engine thread."""
    engine = strategy.llm.llm_engine
    running: dict[str, Running] = {}  # by the id this loop gave the request in vLLM
    ids = itertools.count()
    while True:
        if running and interrupt():
            return _suspend(strategy, running)
        room = max_rows - len(running)
        joiners = take(room) if room > 0 and not stop_admitting() else []
        for request in joiners:
            if request.params.max_new_tokens <= 0:
                deliver(request, GenerateOutput(request.request_id, [], [], "length", strategy.policy_version))
                continue
            state = strategy.rng.take(request)
            key = f"{request.request_id}#{next(ids)}"
            engine_id = engine.add_request(key, strategy._prompt(request), strategy._sampling_params(request, True))
            running[key] = Running(request, engine_id)
            strategy.rng.restore(engine_id, state)
        if not running:
            if joiners:
                continue
            return []
        strategy.stats["engine_steps"] += 1
        for out in strategy.step():
            row = running.get(out.request_id)
            if row is None:
                continue
            if _advance(strategy, row, out):
                del running[out.request_id]
                deliver(row.request, strategy._answer(row.request, row, out.outputs[0].finish_reason))


def _advance(strategy: Any, row: Running, out: Any) -> bool:
    """Add a step's new tokens to `row`; whether the request is done."""
    completion = out.outputs[0]
    new = list(completion.token_ids)
    row.token_ids += new
    row.logprobs += [float(step[tok].logprob) for step, tok in zip(completion.logprobs or [], new)]
    if row.cached_prompt_tokens is None and out.num_cached_tokens is not None:
        row.cached_prompt_tokens = int(out.num_cached_tokens)
    return bool(out.finished)


def _suspend(strategy: Any, running: dict[str, Running]) -> list[Suspended]:
    """Stop every running request at this token boundary: keep its generator state, abort it in
    the engine (its KV blocks freed), and hand back what it sampled."""
    rows = list(running.values())
    strategy.rng.save(rows)
    strategy.llm.llm_engine.abort_request(list(running))
    strategy.stats["interrupted"] += len(rows)
    return [Suspended(row.request, row.token_ids, row.logprobs) for row in rows]
