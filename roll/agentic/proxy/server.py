"""The loopback OpenAI-compatible server agents talk to: `POST /v1/chat/completions`.

Built on Starlette (routing, requests, responses) served by uvicorn, the ASGI pair FastAPI itself
runs on, both maintained by Encode and in wide use. We take Starlette without FastAPI because the
request is validated by our own pydantic models (`protocol`), so that a bad field is a 400 in
OpenAI's error shape naming the field (FastAPI's automatic validation answers 422 in its own
shape). The server runs as a task on the caller's event loop (the env worker's), so a request
reaches the inference gateway without a thread hop; it listens on 127.0.0.1 only.

Authentication: each episode has its own bearer token (`open_episode`); a request without one, or
with a token no live episode holds, is refused (401), and one of an episode already closed is
answered 410. Limits: a body over `max_body_bytes` is 413, malformed JSON 400. Engine failures are
500 with the engine's message (and kept on the episode, which the env manager re-raises).
Responses carry the policy version that generated them (`system_fingerprint`
"roll-policy-v<version>" and the `x-roll-policy-version` header). `stream: true` is answered as
server-sent events: the whole generated answer in one chunk per choice, then the finish reasons.

A client that closes its connection before its answer was delivered (while the engine generates,
or mid-stream) is noticed at once: the request's generation is cancelled (the episode's lock is
released; tokens the engine was computing are discarded), nothing of it is recorded, and the
episode is marked `cut_off` with the cause, which the env manager turns into a dropped episode:
the agent's history no longer matches what the proxy would train on.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import secrets
import time
from collections import OrderedDict

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from roll.agentic.proxy.chat import token_logprobs
from roll.agentic.proxy.protocol import RequestError, parse_request
from roll.agentic.proxy.session import Completion, ProxyEpisode

DEFAULT_MAX_BODY_BYTES = 8 << 20


class _LoopServer(uvicorn.Server):
    """uvicorn without signal handlers: the process (a Ray actor, a test) owns its signals."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


class ProxyServer:
    """See the module docstring. `start()` on the loop that also runs the episodes' generate."""

    def __init__(
        self, *, model_names: tuple[str, ...] = ("roll-policy",), max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    ):
        self.model_names = frozenset(model_names)
        self.max_body_bytes = max_body_bytes
        self.episodes: dict[str, ProxyEpisode] = {}
        self._closed: OrderedDict[str, str] = OrderedDict()  # token -> traj_id, recent ones only
        self._server: _LoopServer | None = None
        self._task: asyncio.Task | None = None
        self._starting: asyncio.Lock | None = None
        self.base_url = ""
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/health", self._health, methods=["GET"]),
            ]
        )

    async def start(self) -> str:
        """Listen on an ephemeral loopback port (once); the base URL, e.g. http://127.0.0.1:43117."""
        self._starting = self._starting or asyncio.Lock()
        async with self._starting:
            if self._server is None:
                config = uvicorn.Config(
                    self.app, host="127.0.0.1", port=0, log_level="warning", access_log=False, lifespan="off"
                )
                self._server = _LoopServer(config)
                self._task = asyncio.get_running_loop().create_task(self._server.serve())
                while not self._server.started:
                    if self._task.done():  # failed to bind: say why
                        self._task.result()
                    await asyncio.sleep(0.01)
                port = self._server.servers[0].sockets[0].getsockname()[1]
                self.base_url = f"http://127.0.0.1:{port}"
        return self.base_url

    async def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            assert self._task is not None  # started with the server
            await self._task
            self._server = None

    def open_episode(self, traj_id: str, **kwargs) -> ProxyEpisode:
        """A live episode with a fresh token (kwargs: `ProxyEpisode`'s fields but token/model_names)."""
        token = f"roll-{secrets.token_urlsafe(18)}"
        episode = ProxyEpisode(token=token, traj_id=traj_id, model_names=self.model_names, **kwargs)
        self.episodes[token] = episode
        return episode

    def close_episode(self, episode: ProxyEpisode) -> None:
        """Refuse the episode's token from now on (a late call gets 410)."""
        self.episodes.pop(episode.token, None)
        self._closed[episode.token] = episode.traj_id
        while len(self._closed) > 65536:
            self._closed.popitem(last=False)

    # ---- endpoints ----
    async def _health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "live_episodes": len(self.episodes)})

    async def _models(self, request: Request) -> Response:
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "roll"} for m in sorted(self.model_names)]
        return JSONResponse({"object": "list", "data": data})

    async def _chat(self, request: Request) -> Response:
        started = time.perf_counter()
        episode = self.episodes.get(_token(request))
        if episode is not None:
            episode.in_flight += 1
        try:
            return await self._serve(request)
        finally:
            if episode is not None:
                episode.in_flight -= 1
                episode.handler_s += time.perf_counter() - started

    async def _serve(self, request: Request) -> Response:
        try:
            episode = self._episode(request)
            body = await self._json(request)
            chat = parse_request(body)
            completion = await _unless_client_leaves(request, episode, episode.complete(chat))
        except _ClientLeft:
            return Response(status_code=499)  # nobody reads it: the connection is closed
        except RequestError as e:
            return JSONResponse(e.body(), status_code=e.status)
        except Exception as e:  # the engine's failure (or a timeout): the agent sees it, the manager re-raises it
            error = RequestError(None, f"generation failed: {type(e).__name__}: {e}", status=500)
            return JSONResponse(error.body(), status_code=500)
        response = self._response(episode, chat.logprobs, completion)
        headers = {"x-roll-policy-version": str(completion.policy_version)}
        if chat.stream:
            return StreamingResponse(
                _delivered(_sse(response), episode), media_type="text/event-stream", headers=headers
            )
        return JSONResponse(response, headers=headers)

    def _episode(self, request: Request) -> ProxyEpisode:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise RequestError(
                None, "no episode token: send 'Authorization: Bearer <token>' (the runner's api_key)", 401
            )
        token = token.strip()
        if token in self.episodes:
            return self.episodes[token]
        if token in self._closed:
            raise RequestError(None, f"episode {self._closed[token]} is over; its token no longer serves", 410)
        raise RequestError(None, "unknown episode token: requests are served only inside a live episode", 401)

    async def _json(self, request: Request):
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise RequestError(
                None, f"request body of {declared} bytes is over the limit of {self.max_body_bytes}", 413
            )
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise RequestError(None, f"request body is over the limit of {self.max_body_bytes} bytes", 413)
            chunks.append(chunk)
        try:
            return json.loads(b"".join(chunks))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RequestError(None, f"the request body is not valid JSON: {e}") from None

    def _response(self, episode: ProxyEpisode, logprobs: bool, completion: Completion) -> dict:
        first = completion.replies[0].out.request_id
        choices = []
        for i, r in enumerate(completion.replies):
            choice = {"index": i, "message": r.message_dict(), "finish_reason": r.finish_reason, "logprobs": None}
            if logprobs:
                choice["logprobs"] = {"content": token_logprobs(episode.tokenizer, r.out), "refusal": None}
            choices.append(choice)
        generated = sum(len(r.out.token_ids) for r in completion.replies)
        return {
            "id": "chatcmpl-" + hashlib.blake2b(first.encode(), digest_size=12).hexdigest(),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": min(self.model_names),
            "system_fingerprint": f"roll-policy-v{completion.policy_version}",
            "choices": choices,
            "usage": {
                "prompt_tokens": completion.prompt_tokens,
                "completion_tokens": generated,
                "total_tokens": completion.prompt_tokens + generated,
            },
        }


class _ClientLeft(Exception):
    """The client closed its connection before its answer was ready."""


async def _unless_client_leaves(request: Request, episode: ProxyEpisode, work):
    """`await work`, unless the client disconnects first: then the work is cancelled, the episode
    marked `cut_off` and `_ClientLeft` raised. The body has been read, so the next ASGI message is
    the disconnect."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        gone.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        episode.cut_off = episode.cut_off or "the client closed its connection while its answer was generated"
        raise _ClientLeft
    return task.result()


async def _disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _delivered(events, episode: ProxyEpisode):
    """`events`, marking the episode `cut_off` when the stream is closed before its last event."""
    sent, finished = 0, False
    try:
        async for event in events:
            yield event
            sent += 1
        finished = True
    finally:
        if not finished:
            episode.cut_off = episode.cut_off or f"the client closed its connection mid-stream ({sent} events sent)"


def _token(request: Request) -> str:
    """The bearer token of `request`, or "" without one."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


async def _sse(response: dict):
    """A completed response as chat.completion.chunk events (see the module docstring)."""
    head = {k: response[k] for k in ("id", "created", "model", "system_fingerprint")}
    for choice in response["choices"]:
        delta = {"role": "assistant", "content": choice["message"]["content"]}
        if choice["message"].get("tool_calls"):
            delta["tool_calls"] = [{"index": k, **c} for k, c in enumerate(choice["message"]["tool_calls"])]
        chunk = {"index": choice["index"], "delta": delta, "finish_reason": None, "logprobs": choice["logprobs"]}
        yield f"data: {json.dumps({**head, 'object': 'chat.completion.chunk', 'choices': [chunk]})}\n\n"
    for choice in response["choices"]:
        chunk = {"index": choice["index"], "delta": {}, "finish_reason": choice["finish_reason"]}
        yield f"data: {json.dumps({**head, 'object': 'chat.completion.chunk', 'choices': [chunk]})}\n\n"
    yield "data: [DONE]\n\n"
