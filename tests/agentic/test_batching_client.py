"""BatchingClient: requests of one moment in one call, cohorts merged while a call is in flight,
releases batched (roll/agentic/rollout/batching_client.py)."""

from __future__ import annotations

import asyncio

import pytest

from roll.agentic.rollout.batching_client import BatchingClient


class _Remote:
    def __init__(self, fn):
        self.remote = fn


class FakeInference:
    """`generate_many.remote(requests)` answers each request with (request, call index) after
    `delay_s`; `release_sessions.remote(ids)` records the ids. Every call is logged."""

    def __init__(self, delay_s: float, fail: bool = False):
        self.delay_s = delay_s
        self.fail = fail
        self.calls: list[list] = []
        self.answered: list[int] = []  # call indices in the order they answered
        self.released: list[list[str]] = []
        self.generate_many = _Remote(self._generate_many)
        self.release_sessions = _Remote(self.released.append)

    def _generate_many(self, requests):
        index = len(self.calls)
        self.calls.append(list(requests))

        async def answer():
            await asyncio.sleep(self.delay_s)
            self.answered.append(index)
            if self.fail:
                raise RuntimeError("engine down")
            return [(r, index) for r in requests]

        return asyncio.ensure_future(answer())


def test_requests_of_one_moment_go_in_one_call_and_get_their_own_answers():
    async def main():
        inference = FakeInference(delay_s=0.001)
        client = BatchingClient(inference)
        outs = await asyncio.gather(*(client.generate(f"r{i}") for i in range(5)))
        return inference, client, outs

    inference, client, outs = asyncio.run(main())
    assert inference.calls == [["r0", "r1", "r2", "r3", "r4"]]
    assert outs == [(f"r{i}", 0) for i in range(5)]
    assert (client.calls, client.requests) == (1, 5)


def test_a_cohort_arriving_mid_call_is_held_and_merged_with_the_next_turn():
    """Cohort A's call is in flight when cohort B asks; B waits for A's answers, and A's next turn
    and B's first go in one call: 2 calls, where sending B at once would make 3 (and 2 a turn on)."""

    async def episode(client, name, turns, start_s):
        await asyncio.sleep(start_s)
        return [await client.generate(f"{name}{t}") for t in range(turns)]

    async def main():
        inference = FakeInference(delay_s=0.05)
        client = BatchingClient(inference, window_s=0.002, hold_s=1.0)
        a = [episode(client, f"a{i}-", 2, 0.0) for i in range(3)]
        b = [episode(client, f"b{i}-", 1, 0.01) for i in range(3)]
        await asyncio.gather(*a, *b)
        return inference

    inference = asyncio.run(main())
    assert [sorted(c) for c in inference.calls] == [
        ["a0-0", "a1-0", "a2-0"],
        ["a0-1", "a1-1", "a2-1", "b0-0", "b1-0", "b2-0"],
    ]


def test_hold_s_bounds_the_wait_behind_a_long_call():
    """A long call (a long decode) holds a newcomer only `hold_s`: it is sent before that call ends."""

    async def main():
        inference = FakeInference(delay_s=0.5)
        client = BatchingClient(inference, window_s=0.002, hold_s=0.02)
        first = asyncio.ensure_future(client.generate("long"))
        await asyncio.sleep(0.01)
        second = await client.generate("late")
        await first
        return inference, second

    inference, second = asyncio.run(main())
    assert inference.calls == [["long"], ["late"]]
    assert second == ("late", 1)
    assert inference.answered == [0, 1]  # both calls ran side by side: the late one did not wait 0.5 s


def test_a_failed_call_fails_each_of_its_requests():
    async def main():
        client = BatchingClient(FakeInference(delay_s=0.001, fail=True))
        return await asyncio.gather(client.generate("x"), client.generate("y"), return_exceptions=True)

    results = asyncio.run(main())
    assert [str(r) for r in results] == ["engine down", "engine down"]


def test_releases_of_one_moment_go_in_one_call():
    async def main():
        inference = FakeInference(delay_s=0.001)
        client = BatchingClient(inference)
        for i in range(300):
            client.release_session(f"traj-{i}")
        await asyncio.sleep(0.01)
        client.release_session("late")
        await asyncio.sleep(0.01)
        return inference

    inference = asyncio.run(main())
    assert inference.released == [[f"traj-{i}" for i in range(300)], ["late"]]


def test_a_release_without_an_event_loop_is_sent_at_once():
    inference = FakeInference(delay_s=0.0)
    BatchingClient(inference).release_session("s")
    assert inference.released == [["s"]]


@pytest.mark.parametrize("window_s", [0.0, 0.002])
def test_every_request_is_answered_under_load(window_s):
    """Many managers, random think times, a slow engine: each gets its own answer, none is lost."""
    import random

    async def manager(client, i, rng):
        outs = []
        for t in range(4):
            await asyncio.sleep(rng.random() * 0.005)
            outs.append(await client.generate(f"{i}/{t}"))
        return outs

    async def main():
        inference = FakeInference(delay_s=0.003)
        client = BatchingClient(inference, window_s=window_s, hold_s=0.01)
        rng = random.Random(0)
        return inference, client, await asyncio.gather(*(manager(client, i, rng) for i in range(40)))

    inference, client, results = asyncio.run(main())
    assert [[r for r, _ in outs] for outs in results] == [[f"{i}/{t}" for t in range(4)] for i in range(40)]
    assert client.requests == 160 == sum(len(c) for c in inference.calls)
    assert client.calls == len(inference.calls) < 160
