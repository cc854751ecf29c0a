"""InferenceGateway: least-loaded routing, sticky sessions, release, bounded memory."""

import asyncio

import pytest

from roll.agentic.agent_loop import SingleTurnAgent, ToolAgent
from roll.agentic.gateway import InferenceGateway, session_key
from roll.core.records import GenerateOutput, GenerateRequest, SamplingParams
from roll.models.tiny import build_tiny_tokenizer


class HeldWorker:
    """A local worker whose answers wait until the test opens `gate`, so requests pile up in
    flight exactly as the test decides; records which requests it served."""

    def __init__(self, answer_ids=(7,)):
        self.served, self.released, self.answer_ids = [], [], list(answer_ids)
        self.gate = asyncio.Event()
        self.gate.set()

    async def generate(self, request):
        self.served.append(request.request_id)
        await asyncio.sleep(0)  # in flight for at least one loop step, like a real engine call
        await self.gate.wait()
        return GenerateOutput(request.request_id, self.answer_ids, [0.0] * len(self.answer_ids), "stop", 0)

    def release_session(self, session_id):
        self.released.append(session_id)
        return True


def req(request_id, session_id=None):
    return GenerateRequest(request_id, [1, 2], SamplingParams(), seed=0, session_id=session_id)


def test_session_key():
    assert session_key(req("traj7/3")) == "traj7"
    assert session_key(req("a/b/3")) == "a/b"
    assert session_key(req("x/1", session_id="s")) == "s"
    assert session_key(req("oneoff")) is None


def test_concurrent_sessions_spread_by_load_and_turns_stick():
    async def main():
        workers = [HeldWorker() for _ in range(3)]
        gw = InferenceGateway(workers)
        for w in workers:
            w.gate.clear()
        first = [asyncio.ensure_future(gw.generate(req(f"s{i}/0"))) for i in range(6)]
        await asyncio.sleep(0)
        assert [len(w.served) for w in workers] == [2, 2, 2]  # round the least loaded, ties by index
        assert [gw.worker_of(f"s{i}") for i in range(6)] == [0, 1, 2, 0, 1, 2]
        # worker 0 is now the busiest; later turns of its sessions still go there
        extra = [asyncio.ensure_future(gw.generate(req("s0/1"))), asyncio.ensure_future(gw.generate(req("s3/1")))]
        await asyncio.sleep(0)
        assert gw.in_flight == [4, 2, 2] and workers[0].served[-2:] == ["s0/1", "s3/1"]
        for w in workers:
            w.gate.set()
        await asyncio.gather(*first, *extra)
        assert gw.in_flight == [0, 0, 0]
        # a new session goes to the least loaded now (all idle: index 0), old ones stay put
        await gw.generate(req("s9/0"))
        await gw.generate(req("s2/1"))
        assert (gw.worker_of("s9"), workers[2].served[-1]) == (0, "s2/1")
        stats = gw.get_stats()
        assert stats["requests_per_worker"] == [5, 2, 3] and stats["sticky_hits"] == 3 and stats["in_flight"] == 0
        return gw

    asyncio.run(main())


def test_a_busy_worker_gets_no_new_sessions():
    async def main():
        slow, fast = HeldWorker(), HeldWorker()
        gw = InferenceGateway([slow, fast])
        slow.gate.clear()
        stuck = asyncio.ensure_future(gw.generate(req("a/0")))
        await asyncio.sleep(0)
        for i in range(5):  # each finishes at once on `fast`, which stays the least loaded
            await gw.generate(req(f"b{i}/0"))
        assert slow.served == ["a/0"] and len(fast.served) == 5
        slow.gate.set()
        await stuck

    asyncio.run(main())


def test_release_frees_stickiness_and_tells_the_worker():
    async def main():
        workers = [HeldWorker(), HeldWorker()]
        gw = InferenceGateway(workers)
        workers[0].gate.clear()
        held = asyncio.ensure_future(gw.generate(req("busy/0")))
        await asyncio.sleep(0)
        await gw.generate(req("t/0", session_id="conv"))  # to worker 1: worker 0 is busy
        workers[0].gate.set()
        await held  # all idle now: a new session would go to worker 0
        await gw.generate(req("t/1", session_id="conv"))
        assert workers[1].served[-1] == "t/1"  # sticky
        assert gw.release("conv") and workers[1].released == ["conv"] and not gw.release("conv")
        await gw.generate(req("t/2", session_id="conv"))
        assert workers[0].served[-1] == "t/2" and gw.worker_of("conv") == 0  # routed afresh

    asyncio.run(main())


def test_one_off_requests_are_not_sticky_and_the_lru_is_bounded():
    async def main():
        gw = InferenceGateway([HeldWorker(), HeldWorker()], max_sessions=2)
        await gw.generate(req("oneoff"))
        assert gw.get_stats()["sticky_sessions"] == 0
        for name in ("a", "b", "a", "c"):  # touching "a" makes "b" the least recently used
            await gw.generate(req(f"{name}/0"))
        assert (gw.worker_of("a"), gw.worker_of("b"), gw.worker_of("c")) == (0, None, 0)
        assert gw.get_stats()["sticky_evictions"] == 1

    asyncio.run(main())
    with pytest.raises(ValueError, match="at least one"):
        InferenceGateway([])


def test_tool_agent_through_the_gateway_keeps_one_worker_and_releases():
    tokenizer = build_tiny_tokenizer(extra_tokens=["<tool_call>", "</tool_call>", '"name"', '"arguments"', '"echo"'])
    call = tokenizer.encode('<tool_call>{"name": "echo", "arguments": {}}</tool_call>', add_special_tokens=False)
    workers = [HeldWorker(call + [tokenizer.eos_token_id]) for _ in range(2)]

    def echo() -> str:
        return "e"

    async def main():
        gw = InferenceGateway(workers)
        agents = [
            ToolAgent({"tools": [echo], "reward_fn": lambda row, text: 0.0, "max_turns": 3}, gw, tokenizer)
            for _ in range(4)
        ]
        trajs = await asyncio.gather(*(a.run(prompt="go", traj_id=f"t{i}") for i, a in enumerate(agents)))
        return gw, trajs

    gw, trajs = asyncio.run(main())
    assert all(t.num_actions == 3 and t.stop_reason == "max_steps" for t in trajs)
    for i in range(4):  # every turn of one episode on one worker
        owners = {k for k, w in enumerate(workers) for rid in w.served if rid.startswith(f"t{i}/")}
        assert len(owners) == 1
    assert sorted(len(w.served) for w in workers) == [6, 6]
    assert gw.get_stats()["sticky_sessions"] == 0  # every episode released its session
    assert sorted(workers[0].released + workers[1].released) == ["t0", "t1", "t2", "t3"]


@pytest.mark.ray
def test_ray_actor_workers():
    ray = pytest.importorskip("ray")
    tokenizer = build_tiny_tokenizer()

    @ray.remote
    class Worker:
        def __init__(self, k):
            self.k = k

        async def generate(self, request):
            return GenerateOutput(request.request_id, [self.k], [0.0], "stop", 0)

        def release_session(self, session_id):
            return True

    ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR")
    try:
        gw = InferenceGateway([Worker.remote(10), Worker.remote(20)])

        async def main():
            outs = await asyncio.gather(*(gw.generate(req(f"s{i}/0")) for i in range(4)))
            again = await gw.generate(req("s1/1"))
            return [o.token_ids[0] for o in outs], again.token_ids[0]

        firsts, again = asyncio.run(main())
        assert firsts == [10, 20, 10, 20] and again == 20 and gw.release("s1")
        # an agent given a bare handle routes through a gateway of one
        agent = SingleTurnAgent({"reward_fn": lambda row, text: 0.5}, Worker.remote(30), tokenizer)
        traj = asyncio.run(agent.run(prompt="go", traj_id="r0"))
        assert isinstance(agent.client, InferenceGateway) and traj.token_ids[-1] == 30 and traj.step_rewards == [0.5]
    finally:
        ray.shutdown()
