"""One live episode behind the proxy: its token, its recorder, and how a validated chat request
becomes engine requests (`ProxyEpisode.complete`).

Sampling follows the request where it says something (`temperature`, `top_p`, `max_tokens`,
`stop`, `n`, `seed`) and the env manager otherwise (`generating_args`, `top_k`, its stop tokens);
`max_tokens` can only lower the manager's per-step cap (`max_tokens_per_step`) and the room left
in `sequence_length`. `temperature: 0` is greedy. Every choice is its own engine request,
`traj_id/k` with k counting the episode's generations, in the conversation's session (the
engine keeps its KV between turns) and with a seed derived from the episode's sample seed, k and
the request's `seed`: the same episode replays the same tokens.

`tool_choice` "required" or a named function cannot be forced on a sampling engine: they are
served as "auto" (the tools are shown; the answer's `<tool_call>` blocks are parsed). "none"
shows the tools and parses nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from roll.agentic.generation import GenerateFn, generate_within
from roll.agentic.proxy.chat import Reply, reply
from roll.agentic.proxy.protocol import ChatCompletionRequest, RequestError
from roll.agentic.proxy.recorder import EpisodeRecorder
from roll.core.records import GenerateRequest, SamplingParams
from roll.core.seeding import derive_seed


@dataclass
class Completion:
    replies: list[Reply]
    prompt_tokens: int

    @property
    def policy_version(self) -> int:
        return max(r.out.policy_version for r in self.replies)


@dataclass
class ProxyEpisode:
    """What the server knows of one episode; the env manager opens and closes it."""

    token: str
    traj_id: str
    sample_seed: int
    tokenizer: Any
    generate: GenerateFn
    sampling: SamplingParams  # the manager's, max_new_tokens already capped per step
    sequence_length: int
    model_names: frozenset[str]
    generate_timeout_s: float | None = 300.0
    recorder: EpisodeRecorder = field(init=False)  # made in __post_init__
    out_of_tokens: bool = False  # a request found no room left in sequence_length
    failure: BaseException | None = None  # what the engine raised, if it did
    cut_off: str | None = None  # why an answer never reached the agent (the server's module docstring)
    requests: int = 0
    in_flight: int = 0  # requests the server is serving now
    handler_s: float = 0.0  # seconds the server spent on this episode's requests (engine included)
    generate_s: float = 0.0  # ... of which waiting for the engine
    _generations: int = 0
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def __post_init__(self):
        self.recorder = EpisodeRecorder(self.tokenizer)

    @property
    def overhead_s(self) -> float:
        """Seconds the server spent on this episode's requests besides waiting for the engine."""
        return self.handler_s - self.generate_s

    async def wait_idle(self, timeout_s: float) -> None:
        """Until no request of the episode is being served, or `timeout_s` has passed: a runner
        that gave up on a call returns before the server has seen its connection close."""
        deadline = time.monotonic() + timeout_s
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.005)

    def stop_ids(self, stops: list[str]) -> list[int]:
        ids = []
        for s in stops:
            encoded = self.tokenizer.encode(s, add_special_tokens=False)
            if len(encoded) != 1:
                raise RequestError(
                    "stop", f"stop: {s!r} is {len(encoded)} tokens; only single-token stop strings are served"
                )
            ids.append(encoded[0])
        return ids

    def params(self, request: ChatCompletionRequest, room: int, stop_ids: list[int]) -> SamplingParams:
        s = self.sampling
        limit = min(s.max_new_tokens, room, request.token_limit() or s.max_new_tokens)
        temperature = s.temperature if request.temperature is None else request.temperature
        return dataclasses.replace(
            s,
            max_new_tokens=limit,
            temperature=temperature,
            top_p=s.top_p if request.top_p is None else request.top_p,
            do_sample=s.do_sample and temperature > 0,
            stop_token_ids=list(dict.fromkeys([*s.stop_token_ids, *stop_ids])),
        )

    async def complete(self, request: ChatCompletionRequest) -> Completion:
        if request.model is not None and request.model not in self.model_names:
            raise RequestError(
                "model", f"model: {request.model!r} is not served here; served: {sorted(self.model_names)}"
            )
        stop_ids = self.stop_ids(request.stop_strings())
        tools = [t.model_dump(exclude_none=True) for t in request.tools or []]
        async with self._lock:  # one request of an episode at a time: its calls keep their order
            self.requests += 1
            prompt = self.recorder.prompt(request.messages, tools)
            room = self.sequence_length - len(prompt.ids)
            if room <= 0:
                self.out_of_tokens = True
                raise RequestError(
                    "messages",
                    f"messages: the conversation is {len(prompt.ids)} tokens, "
                    f"the episode's sequence_length {self.sequence_length}: no room to generate",
                )
            params = self.params(request, room, stop_ids)
            first = self._generations
            self._generations += request.n
            engine_requests = [
                GenerateRequest(
                    f"{self.traj_id}/{k}",
                    list(prompt.ids),
                    params,
                    derive_seed(self.sample_seed, k, request.seed or 0),
                    session_id=self.traj_id,
                )
                for k in range(first, first + request.n)
            ]
            started = time.perf_counter()
            try:
                outs = await _generate_all(self.generate, engine_requests, self.generate_timeout_s)
            except Exception as e:
                self.failure = e
                raise
            finally:
                self.generate_s += time.perf_counter() - started
            tools_on = bool(tools) and request.tool_choice != "none"
            replies = [reply(self.tokenizer, out, set(stop_ids), tools_on) for out in outs]
            for r in replies:
                self.recorder.record(prompt, r.out, r.message)
            return Completion(replies, len(prompt.ids))


async def _generate_all(generate: GenerateFn, requests: list[GenerateRequest], timeout_s: float | None) -> list:
    """The choices' outputs; one choice (the usual request) is awaited in the handler's own task,
    not through `gather`'s, which would cost two more trips through the event loop."""
    if len(requests) == 1:
        return [await generate_within(generate, requests[0], timeout_s)]
    return await asyncio.gather(*(generate_within(generate, r, timeout_s) for r in requests))
