"""`generate_live`, the batch split the external engines share: only requests that ask for tokens
reach the engine, in one call, and the answers come back in request order."""

from __future__ import annotations

from roll.core.records import GenerateOutput, GenerateRequest, SamplingParams
from roll.distributed.strategies.engine_api import generate_live


def test_requests_for_no_tokens_never_reach_the_engine_and_order_is_kept():
    requests = [
        GenerateRequest(str(i), [1, 2], SamplingParams(max_new_tokens=n), seed=i)
        for i, n in enumerate([3, 0, 5, -1, 2])
    ]
    calls = []

    def engine(live):
        calls.append([r.request_id for r in live])
        return [
            GenerateOutput(r.request_id, [7] * r.params.max_new_tokens, [-0.5] * r.params.max_new_tokens, "length", 4)
            for r in live
        ]

    outputs = generate_live(requests, engine, policy_version=4)
    assert calls == [["0", "2", "4"]]
    assert [o.request_id for o in outputs] == ["0", "1", "2", "3", "4"]
    assert [len(o.token_ids) for o in outputs] == [3, 0, 5, 0, 2]
    assert (outputs[1].finish_reason, outputs[1].logprobs, outputs[1].policy_version) == ("length", [], 4)


def test_a_batch_of_only_empty_requests_makes_no_engine_call():
    def engine(live):
        raise AssertionError("the engine was called")

    outputs = generate_live([GenerateRequest("a", [1], SamplingParams(max_new_tokens=0), seed=0)], engine, 0)
    assert [(o.request_id, o.token_ids) for o in outputs] == [("a", [])]
