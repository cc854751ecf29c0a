"""Where one chat request through the proxy spends its milliseconds (docs/benchmarks.md, proxy).

Not a ratio table: a breakdown that says which part of `proxy_overhead.py`'s overhead is whose.
Agents are threads with the real `openai` client, the `ProxyServer` runs on its own event loop in
this process, as in an env worker. Each request carries an `x-key` header and is stamped at every
phase boundary on both sides of the socket (the openai client builds it, loopback and HTTP
parsing, routing, body, validation, prompt ids, engine request, the engine call, the reply and
its recording, the response, loopback back, the client parsing it); the table gives each phase's
median and mean over all requests, then `total - engine`, `server - engine`, the same engine
requests sent straight to the engine, and the CPU a request costs the agents' threads and the
server's event loop.

`--engine instant` answers every request at once (the proxy alone); `--engine ray` is the tiny
model's `InferenceWorker` as a Ray actor behind the gateway, as `proxy_overhead.py` runs it.

    python benchmarks/agents/proxy_phases.py --engine ray --episodes 1 --rounds 30
    python benchmarks/agents/proxy_phases.py --engine ray --episodes 64 --rounds 3

The phase boundaries in full, and every run: benchmarks/results/proxy_overhead.md.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from contextvars import ContextVar
from pathlib import Path

import httpx
import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: import from this checkout
import envs  # noqa: F401  (registers the built-in envs)
import roll.agentic.proxy.server as server_module
from roll.agentic.env.registry import make_env
from roll.agentic.proxy.recorder import EpisodeRecorder
from roll.agentic.proxy.server import ProxyServer
from roll.core.records import GenerateOutput, SamplingParams
from roll.models.loading import load_tokenizer
from roll.models.tiny import build_tiny_model
from roll.pipeline.tiny_model import env_corpus

PHASES = [
    "call",
    "client_sent",
    "asgi_in",
    "chat_in",
    "json_done",
    "parsed",
    "prompt_in",
    "prompt_out",
    "gen_in",
    "gen_out",
    "complete_done",
    "chat_out",
    "asgi_sent",
    "client_headers",
    "returned",
]
KEY: ContextVar[str | None] = ContextVar("key", default=None)  # the request being served
stamps: dict[str, dict[str, float]] = defaultdict(dict)  # request key -> phase -> perf_counter


def mark(key: str | None, phase: str) -> None:
    if key is not None:
        stamps[key][phase] = time.perf_counter()


class StampedApp:
    """The server's ASGI app, stamped where uvicorn hands it a request and where it is written."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        key = dict(scope.get("headers", [])).get(b"x-key", b"").decode() or None
        KEY.set(key)
        mark(key, "asgi_in")

        async def stamped_send(message):
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                mark(key, "asgi_sent")

        await self.app(scope, receive, stamped_send)


def wrap(owner, name: str, before: str | None, after: str | None) -> None:
    """Stamp `before` and `after` around `owner.name` (a plain or a coroutine function)."""
    original = getattr(owner, name)
    if asyncio.iscoroutinefunction(original):

        async def stamped(*args, **kwargs):
            before and mark(KEY.get(), before)
            result = await original(*args, **kwargs)
            after and mark(KEY.get(), after)
            return result
    else:

        def stamped(*args, **kwargs):
            before and mark(KEY.get(), before)
            result = original(*args, **kwargs)
            after and mark(KEY.get(), after)
            return result

    setattr(owner, name, stamped)


def instrument() -> None:
    wrap(ProxyServer, "_chat", "chat_in", "chat_out")
    wrap(server_module, "parse_request", "json_done", "parsed")
    wrap(EpisodeRecorder, "prompt", "prompt_in", "prompt_out")
    wrap(ProxyServer, "_response", "complete_done", None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["instant", "ray"], default="ray")
    parser.add_argument("--episodes", type=int, default=1)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    instrument()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(f"{tmp}/m", corpus=env_corpus("frozen_lake", {}))
        tokenizer = load_tokenizer(model_dir)
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, daemon=True).start()

        def run(coro):
            return asyncio.run_coroutine_threadsafe(coro, loop).result()

        if args.engine == "instant":
            answer = tokenizer.encode("<answer>Left</answer>", add_special_tokens=False)

            async def engine(request):
                return GenerateOutput(request.request_id, list(answer), [-0.5] * len(answer), "length", 0)
        else:
            import ray

            from roll.agentic.gateway import InferenceGateway
            from roll.distributed.workers.inference import InferenceWorker
            from roll.pipeline.setup.builders import init_ray

            init_ray(None)
            worker = ray.remote(InferenceWorker).options(num_cpus=0).remote(model_dir, num_threads=1)
            gateway = InferenceGateway([worker])
            engine = gateway.generate

        sent = []  # the engine requests the proxy made, replayed straight to the engine at the end

        async def generate(request):
            sent.append(request)
            mark(KEY.get(), "gen_in")
            out = await engine(request)
            mark(KEY.get(), "gen_out")
            return out

        server = ProxyServer()
        server.app = StampedApp(server.app)
        base_url = run(server.start())
        hooks = {
            "request": [lambda r: mark(r.headers["x-key"], "client_sent")],
            "response": [lambda r: mark(r.request.headers["x-key"], "client_headers")],
        }
        client = openai.OpenAI(
            base_url=f"{base_url}/v1",
            api_key="-",
            max_retries=0,
            http_client=httpx.Client(event_hooks=hooks, timeout=600),
        )

        def episode(name: str, seed: int) -> None:
            async def open_episode():
                return server.open_episode(
                    name,
                    sample_seed=seed,
                    tokenizer=tokenizer,
                    generate=generate,
                    sampling=SamplingParams(max_new_tokens=16, temperature=1.0),
                    sequence_length=2048,
                )

            live = run(open_episode())
            agent = client.with_options(api_key=live.token)
            board, info = make_env("frozen_lake", {}).reset(seed=seed)
            messages = [{"role": "system", "content": info["env_instruction"]}, {"role": "user", "content": board}]
            started = time.thread_time()
            for turn in range(args.turns):
                key = f"{name}/{turn}"
                mark(key, "call")
                answer = agent.chat.completions.create(
                    model="roll-policy", messages=messages, extra_headers={"x-key": key}
                )
                mark(key, "returned")
                messages += [
                    {"role": "assistant", "content": answer.choices[0].message.content or ""},
                    {"role": "user", "content": "Next?"},
                ]
            agent_cpu.append(time.thread_time() - started)
            server.close_episode(live)

        agent_cpu: list[float] = []

        async def thread_cpu() -> float:
            return time.thread_time()

        def one_round(r: int) -> None:
            threads = [threading.Thread(target=episode, args=(f"r{r}e{i}", i)) for i in range(args.episodes)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

        one_round(-1)  # warm-up
        stamps.clear()
        agent_cpu.clear()
        sent.clear()
        direct, loop_cpu = [], 0.0

        async def replay(requests):  # one episode's requests in order, as proxy_overhead.py's engine mode
            for request in requests:
                started = time.perf_counter()
                await engine(request)
                direct.append(time.perf_counter() - started)

        async def replay_round(requests):
            episodes = defaultdict(list)
            for request in requests:
                episodes[request.session_id].append(request)
            forget(episodes)  # the engine forgets the proxy's KV of these conversations
            await asyncio.gather(*(replay(rs) for rs in episodes.values()))
            forget(episodes)

        def forget(sessions):
            if args.engine == "ray":
                for session in sessions:
                    gateway.release(session)

        for r in range(args.rounds):  # proxy and direct take turns
            loop_cpu -= run(thread_cpu())
            one_round(r)
            loop_cpu += run(thread_cpu())
            run(replay_round(sent))
            sent.clear()
        run(server.stop())
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    complete = [s for s in stamps.values() if all(p in s for p in PHASES)]
    print(f"engine={args.engine} episodes={args.episodes} requests={len(complete)} load={load}")
    print(f"{'phase':>40} {'median ms':>10} {'mean ms':>9}")
    rows = {f"{a} -> {b}": [s[b] - s[a] for s in complete] for a, b in zip(PHASES, PHASES[1:])}
    rows["total"] = [s["returned"] - s["call"] for s in complete]
    rows["total - engine"] = [s["returned"] - s["call"] - (s["gen_out"] - s["gen_in"]) for s in complete]
    rows["server - engine"] = [s["asgi_sent"] - s["asgi_in"] - (s["gen_out"] - s["gen_in"]) for s in complete]
    for name, seconds in list(rows.items())[:-3]:
        print(f"{name:>40} {statistics.median(seconds) * 1e3:>10.3f} {statistics.mean(seconds) * 1e3:>9.3f}")
    rows["the same requests straight to the engine"] = direct
    for name, seconds in list(rows.items())[-4:]:
        print(f"{name:>40} {statistics.median(seconds) * 1e3:>10.3f} {statistics.mean(seconds) * 1e3:>9.3f}")
    requests = args.rounds * args.episodes * args.turns
    print(
        f"CPU ms a request: agent threads (the openai client) {sum(agent_cpu) / requests * 1e3:.3f}, "
        f"the server's event loop (uvicorn, Starlette, the handler, the gateway) {loop_cpu / requests * 1e3:.3f}"
    )


if __name__ == "__main__":
    main()
