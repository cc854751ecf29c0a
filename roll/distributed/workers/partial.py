"""Partial rollout's bookkeeping in the inference worker: what becomes of a request that a weight
update stopped at a token boundary (`continuous.serve`'s `Suspended` rows).

Modes (the config's `partial_rollout`):
- "continue": the request is served again as a continuation: its prompt plus the ids sampled so
  far, the rest of its token budget, the same seed at the next index of its random stream
  (`GenerateRequest.sample_offset`), so under unchanged weights it samples exactly what the
  uninterrupted request would have. The prefix's KV is recomputed under the new weights by the
  continuation's prefill. Its answer is joined to the part before it: every token keeps the
  version and log-prob it was sampled with (`GenerateOutput.token_versions`).
- "abort": the request is served again from the start under the new weights and its tokens are
  thrown away (ROLL's behaviour at a weight sync), counted in `discarded_tokens`.
- "finish" (the default) never interrupts: running requests end on the old weights first.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from roll.core.records import GenerateOutput, GenerateRequest
from roll.distributed.strategies.engine_api import Suspended

INTERRUPT_MODES = ("finish", "continue", "abort")
COUNTS = ("interrupted_requests", "discarded_tokens", "recomputed_tokens")
"""Running requests stopped; tokens thrown away ("abort"); prompt and sampled ids prefilled again
to continue them ("continue")."""


@dataclass
class Segments:
    """What an interrupted request generated before its continuation: ids, log-probs, versions."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)

    def add(self, token_ids: list[int], logprobs: list[float], version: int) -> None:
        self.token_ids = self.token_ids + list(token_ids)
        self.logprobs = self.logprobs + list(logprobs)
        self.versions = self.versions + [version] * len(token_ids)

    def joined(self, request_id: str, rest: GenerateOutput) -> GenerateOutput:
        """The whole answer: these tokens, then the continuation's."""
        return GenerateOutput(
            request_id,
            self.token_ids + rest.token_ids,
            self.logprobs + rest.logprobs,
            rest.finish_reason,
            rest.policy_version,
            self.versions + rest.token_versions,
        )


def continuation(request: GenerateRequest, before: Segments) -> GenerateRequest:
    """The request that samples the rest of `request` after the tokens `before`."""
    done = len(before.token_ids)
    return GenerateRequest(
        request.request_id,
        request.prompt_ids + before.token_ids,
        replace(request.params, max_new_tokens=request.params.max_new_tokens - done),
        request.seed,
        session_id=request.session_id,
        images=request.images,
        sample_offset=request.sample_offset + done,
    )


class PartialRequests:
    """The worker's interrupted requests and its counts (`COUNTS`), for one interrupt mode."""

    def __init__(self, mode: str):
        if mode not in INTERRUPT_MODES:
            raise ValueError(f"interrupt: {mode!r} is not one of {INTERRUPT_MODES}")
        self.mode = mode
        self.counts = dict.fromkeys(COUNTS, 0)
        self._since_taken = dict.fromkeys(COUNTS, 0)
        # id(continuation) -> (the request as the sender made it, what came before the continuation)
        self._continued: dict[int, tuple[GenerateRequest, Segments]] = {}

    def resume(self, item: Suspended, version: int) -> GenerateRequest:
        """The request to serve in place of the stopped `item`; `version` sampled its tokens."""
        original, before = self._continued.pop(id(item.request), (item.request, Segments()))
        counts = {"interrupted_requests": 1}
        if self.mode == "abort":
            counts["discarded_tokens"] = len(before.token_ids) + len(item.token_ids)
            request = original
        else:
            before.add(item.token_ids, item.logprobs, version)
            request = continuation(original, before)
            self._continued[id(request)] = (original, before)
            counts["recomputed_tokens"] = len(request.prompt_ids)
        for key, value in counts.items():
            self.counts[key] += value
            self._since_taken[key] += value
        return request

    def whole(self, request: GenerateRequest, output: GenerateOutput) -> GenerateOutput:
        """`output` as the answer to the request the sender made: joined to the part before it
        when `request` is a continuation."""
        if id(request) not in self._continued:
            return output
        original, before = self._continued.pop(id(request))
        return before.joined(original.request_id, output)

    def take_counts(self) -> dict[str, int]:
        """The counts since the last call."""
        taken, self._since_taken = self._since_taken, dict.fromkeys(COUNTS, 0)
        return taken

    def clear(self) -> None:
        """Forget every continuation (the engine failed: their requests fail with it)."""
        self._continued.clear()
