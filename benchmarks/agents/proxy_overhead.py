"""The chat proxy's overhead per request against the engine's own generate call, and a burst of
concurrent episodes through it (docs/agent_proxy.md).

As in a run: the engine is a Ray actor, and this process hosts the gateway, the `ProxyServer` and
the agents' threads (`--agents processes`: the agents in processes of their own). Three modes
play the same episodes, in turns within each repeat: proxy (each episode a thread with the real
`openai` client), engine (the very engine requests the proxy made, sent to `gateway.generate`
paced as the proxy sent them: the baseline) and b2b (the same requests back to back). Every mode
generates the same tokens (`same ids`). Overhead = median proxy latency / median engine latency
- 1 within a repeat, the median over the repeats; `handler ms` is the server's own part. Then
`--burst` episodes at once, counting failed requests. Which part is whose: `proxy_phases.py`.

    python benchmarks/agents/proxy_overhead.py [--episodes 1 64 --burst 256 --turns 3 --max_new_tokens 16 --repeats 7]
    python benchmarks/agents/proxy_overhead.py --model smollm2-shape   # engine calls of a real small model's length
    python benchmarks/agents/proxy_overhead.py --agents processes       # agents as programs of their own

The last line is `RESULT model=<m> agents=<a> overhead_1=<x> overhead_64=<y> burst_failed=<n>`
(target <= 0.10, 0). Each row and the burst print the load average at their end. The method in
full, and every run: benchmarks/results/proxy_overhead.md.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import openai
import ray
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: import from this checkout
import envs  # noqa: F401  (registers the built-in envs)
from roll.agentic.env.registry import make_env
from roll.agentic.gateway import InferenceGateway
from roll.agentic.proxy.server import ProxyServer
from roll.core.records import GenerateOutput, GenerateRequest, SamplingParams
from roll.distributed.workers.inference import InferenceWorker
from roll.models.loading import load_tokenizer
from roll.models.tiny import build_tiny_model
from roll.pipeline.setup.builders import init_ray
from roll.pipeline.tiny_model import env_corpus


@dataclass
class EngineCall:
    """One engine request the proxy made, its answer, and when (perf_counter) it was sent and answered."""

    request: GenerateRequest
    out: GenerateOutput
    sent: float
    answered: float


class Host:
    """The event loop of an env worker, in a thread: the inference worker, gateway and proxy."""

    def __init__(self, model_dir: str, threads: int):
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.tokenizer = load_tokenizer(model_dir)
        worker = ray.remote(InferenceWorker).options(num_cpus=0).remote(model_dir, num_threads=threads)
        self.gateway = InferenceGateway([worker])
        self.engine_requests: list = []
        self.server = ProxyServer()
        self.base_url = self.run(self.server.start())
        self.client = openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="-", max_retries=0, timeout=600)

    def run(self, coro, timeout=3600):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def recorded(self, request):
        sent = time.perf_counter()
        out = await self.gateway.generate(request)
        self.engine_requests.append(EngineCall(request, out, sent, time.perf_counter()))
        return out

    def open(self, name: str, seed: int, max_new_tokens: int):
        async def make():
            return self.server.open_episode(
                name,
                sample_seed=seed,
                tokenizer=self.tokenizer,
                generate=self.recorded,
                sampling=SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0),
                sequence_length=2048,
            )

        return self.run(make())


def play(client: openai.OpenAI, name: str, token: str, seed: int, turns: int, latencies: list, failures: list) -> None:
    """One agent's episode: `turns` chat calls with the real `openai` client, its latencies kept."""
    client = client.with_options(api_key=token)  # one connection pool, as a runner keeps
    board, info = make_env("frozen_lake", {}).reset(seed=seed)
    messages = [{"role": "system", "content": info["env_instruction"]}, {"role": "user", "content": board}]
    for turn in range(turns):
        started = time.perf_counter()
        try:
            answer = client.chat.completions.create(model="roll-policy", messages=messages).choices[0].message
        except openai.OpenAIError as e:
            failures.append(f"{name}/{turn}: {e}")
            break
        latencies.append(time.perf_counter() - started)
        messages += [{"role": "assistant", "content": answer.content or ""}, {"role": "user", "content": "Next?"}]


def play_all(client: openai.OpenAI, jobs: list[tuple[str, str, int]], turns: int) -> tuple[list[float], list[str]]:
    """Every job (name, token, seed) at once, a thread each; their latencies and failures."""
    latencies: list[float] = []
    failures: list[str] = []
    threads = [threading.Thread(target=play, args=(client, *job, turns, latencies, failures)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, failures


def agent_process(conn, base_url: str) -> None:
    """An agent program of its own (`--agents processes`): plays the jobs it is sent until None."""
    client = openai.OpenAI(base_url=base_url, api_key="-", max_retries=0, timeout=600)
    while (message := conn.recv()) is not None:
        jobs, turns = message
        conn.send(play_all(client, jobs, turns))


class AgentProcesses:
    """`n` agent processes (spawned, each with its own `openai` client and GIL), episodes dealt
    round-robin; each plays its share as threads."""

    def __init__(self, n: int, base_url: str):
        ctx = multiprocessing.get_context("spawn")
        self.conns, self.procs = [], []
        for _ in range(n):
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=agent_process, args=(theirs, base_url), daemon=True)
            proc.start()
            self.conns.append(ours)
            self.procs.append(proc)

    def play(self, jobs: list[tuple[str, str, int]], turns: int) -> tuple[list[float], list[str]]:
        shares = [jobs[i :: len(self.conns)] for i in range(len(self.conns))]
        for conn, share in zip(self.conns, shares):
            conn.send((share, turns))
        latencies: list[float] = []
        failures: list[str] = []
        for conn in self.conns:
            lat, fail = conn.recv()
            latencies += lat
            failures += fail
        return latencies, failures

    def close(self) -> None:
        for conn in self.conns:
            conn.send(None)
        for proc in self.procs:
            proc.join(timeout=30)


def run_proxy(host: Host, episodes: int, args, tag: str, agents: AgentProcesses | None = None):
    """Latencies, failures, the engine calls made, the handler's own time per request, and when
    the episodes started. The agents are threads of this process, or `agents`' processes."""
    host.engine_requests = []
    opened = [host.open(f"{tag}-{i}", i, args.max_new_tokens) for i in range(episodes)]
    jobs = [(f"{tag}-{i}", episode.token, i) for i, episode in enumerate(opened)]
    started = time.perf_counter()
    if agents is None:
        latencies, failures = play_all(host.client, jobs, args.turns)
    else:
        latencies, failures = agents.play(jobs, args.turns)
    for episode in opened:
        host.server.close_episode(episode)
    handler = statistics.mean(e.overhead_s / max(e.requests, 1) for e in opened)
    recorded = list(host.engine_requests)
    for session in {c.request.session_id for c in recorded}:  # the engine forgets the conversations' KV
        host.loop.call_soon_threadsafe(host.gateway.release, session)
    return latencies, failures, recorded, handler, started


def run_engine(host: Host, recorded: list[EngineCall], proxy_started: float, paced: bool) -> tuple[list[float], dict]:
    """The proxy's engine requests again, straight to the gateway, each episode's turns in order:
    paced as the proxy sent them (each request as long after its episode's previous answer, the
    first as long after the start) or back to back."""
    by_episode: dict[str, list[EngineCall]] = {}
    for call in recorded:
        by_episode.setdefault(call.request.session_id, []).append(call)
    latencies, outs = [], {}

    async def episode(calls: list[EngineCall], started: float):
        calls = sorted(calls, key=lambda c: int(c.request.request_id.rsplit("/", 1)[1]))
        answered, proxy_answered = started, proxy_started
        for call in calls:
            if paced:
                await asyncio.sleep(max(0.0, answered + (call.sent - proxy_answered) - time.perf_counter()))
            sent = time.perf_counter()
            outs[call.request.request_id] = await host.gateway.generate(call.request)
            answered, proxy_answered = time.perf_counter(), call.answered
            latencies.append(answered - sent)
        host.gateway.release(calls[0].request.session_id)

    async def all_episodes():
        started = time.perf_counter()
        await asyncio.gather(*(episode(calls, started) for calls in by_episode.values()))

    host.run(all_episodes())
    return latencies, outs


def load() -> float:
    """The 1-minute load average: what else this machine was doing."""
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


MODELS = {
    "tiny": {},
    "smollm2-shape": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, intermediate_size=1536),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--burst", type=int, default=256)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max_new_tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--min_requests", type=int, default=90)
    parser.add_argument("--model", choices=sorted(MODELS), default="tiny")
    parser.add_argument(
        "--agents",
        choices=["threads", "processes"],
        default="threads",
        help="threads of the proxy's process (as the built-in runners in an env worker) or agent programs of their own",
    )
    parser.add_argument("--agent_procs", type=int, default=4, help="with --agents processes: how many")
    args = parser.parse_args()
    torch.manual_seed(0)
    init_ray(None)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(f"{tmp}/m", corpus=env_corpus("frozen_lake", {}), **MODELS[args.model])
        host = Host(model_dir, args.threads)
        agents = AgentProcesses(args.agent_procs, f"{host.base_url}/v1") if args.agents == "processes" else None
        run_proxy(host, 4, args, "warmup", agents)  # first calls of the engine and the server are slower
        print(
            f"{'episodes':>8} {'repeats':>7} {'requests':>8} {'engine ms':>10} {'proxy ms':>9} {'overhead':>9} "
            f"{'mean overhead':>13} {'b2b engine ms':>13} {'overhead vs b2b':>15} {'handler ms':>10} "
            f"{'same ids':>8} {'load':>5}"
        )
        overheads = {}
        for n in args.episodes:
            rows = {k: [] for k in ("proxy", "engine", "b2b", "handler", "ratio", "mean_ratio", "b2b_ratio")}
            same = True
            repeats = max(args.repeats, math.ceil(args.min_requests / (n * args.turns)))
            for r in range(repeats):
                proxy_lat, failures, recorded, handler, started = run_proxy(host, n, args, f"e{n}r{r}", agents)
                assert not failures, failures[:3]
                engine_lat, outs = run_engine(host, recorded, started, paced=True)
                b2b_lat, b2b_outs = run_engine(host, recorded, started, paced=False)
                for o in (outs, b2b_outs):
                    same &= all(o[c.request.request_id].token_ids == c.out.token_ids for c in recorded)
                rows["proxy"].append(statistics.median(proxy_lat) * 1e3)
                rows["engine"].append(statistics.median(engine_lat) * 1e3)
                rows["b2b"].append(statistics.median(b2b_lat) * 1e3)
                rows["handler"].append(handler * 1e3)
                # paired: the same minutes of load
                rows["ratio"].append(rows["proxy"][-1] / rows["engine"][-1] - 1)
                rows["mean_ratio"].append(statistics.mean(proxy_lat) / statistics.mean(engine_lat) - 1)
                rows["b2b_ratio"].append(rows["proxy"][-1] / rows["b2b"][-1] - 1)
            m = {k: statistics.median(v) for k, v in rows.items()}
            overheads[n] = m["ratio"]
            print(
                f"{n:>8} {repeats:>7} {len(proxy_lat):>8} {m['engine']:>10.1f} {m['proxy']:>9.1f} {m['ratio']:>+9.1%} "
                f"{m['mean_ratio']:>+13.1%} {m['b2b']:>13.1f} {m['b2b_ratio']:>+15.1%} {m['handler']:>10.2f} "
                f"{str(same):>8} {load():>5.1f}",
                flush=True,
            )
        started = time.perf_counter()
        burst_lat, failures, *_ = run_proxy(host, args.burst, args, "burst", agents)
        wall = time.perf_counter() - started
        print(
            f"burst: {args.burst} concurrent episodes, {len(burst_lat)} requests served, {len(failures)} failed, "
            f"{wall:.1f} s, mean latency {statistics.mean(burst_lat) * 1e3:.0f} ms, load {load():.1f}"
        )
        for f in failures[:5]:
            print("  failed:", f)
        if agents is not None:
            agents.close()
        host.run(host.server.stop())
    ray.shutdown()
    summary = " ".join(f"overhead_{n}={v:.4f}" for n, v in overheads.items())
    print(f"RESULT model={args.model} agents={args.agents} {summary} burst_failed={len(failures)}")


if __name__ == "__main__":
    main()
