"""Inference worker: token-in/token-out generation with dynamic batching.

Env managers call `generate(request)` concurrently and the worker batches them: with `hf`
and `vllm` continuously (a request joins the running batch at the next decode step and is answered
when its row stops), otherwise each engine call takes everything pending, up to `max_batch_size`. Requests
with a `session_id` reuse their conversation's KV (`hf`'s `max_cached_tokens`; vLLM and SGLang
cache prefixes themselves). `strategy_name` picks the engine (`hf`, `vllm`, `sglang`), each
imported only when chosen.

Contract: `offload` / `reload` (a GPU shared with a training role) wait for the engine call in
progress; requests that arrive meanwhile wait for `reload`, and new weights are refused until then.
What a weight update does to the requests running at that moment is `interrupt` (the config's
`partial_rollout`): "finish" lets them end on the old weights first; "continue" stops them at a
token boundary and, once the weights are in, continues each from where it stopped (every token
keeps the version and log-prob it was sampled with); "abort" throws their tokens away and serves
them again from the start. The continuous engines stop at a token boundary: `hf` and `vllm` (text).
An engine that raises is failed for good (`EngineFailed`): every pending and later request fails
with the engine's message, and the run stops with one line, exit 1.

The batching modes, sessions and the failure rule in full: docs/engines/index.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import ray
import torch

from roll.core.errors import EngineFailed
from roll.core.records import GenerateOutput, GenerateRequest
from roll.distributed.strategies.base import InferStrategy
from roll.distributed.strategies.engine_api import Suspended
from roll.distributed.strategies.hf import continuous
from roll.distributed.strategies.hf.infer import HFInferStrategy
from roll.distributed.strategies.hf.kv_cache import DEFAULT_MAX_CACHED_TOKENS
from roll.distributed.strategies.registry import canonical_name, strategy_class
from roll.distributed.weight_transfer import IpcWeights
from roll.distributed.workers.common import set_num_threads, take_memory_gib
from roll.distributed.workers.partial import PartialRequests
from roll.distributed.workers.work_clock import Clocked
from roll.models.loading import load_policy, load_tokenizer, vision_token_ids

logger = logging.getLogger(__name__)


class InferenceWorker(Clocked):
    """Ray actor (async): owns one inference engine and the policy version it serves."""

    def __init__(
        self,
        model_path: str,
        *,
        dtype: str = "float32",
        max_batch_size: int = 256,
        num_threads: int | None = None,
        max_cached_tokens: int = DEFAULT_MAX_CACHED_TOKENS,
        strategy_name: str = "hf",
        strategy_config: dict | None = None,
        device: str = "cpu",
        continuous_batching: bool = True,
        batch_wait_ms: float = 0.0,
        static_decode: bool | None = None,
        weight_store: str | None = None,
        attn_implementation: str | None = None,
        interrupt: str = "finish",
    ):
        set_num_threads(num_threads, device)
        tokenizer = load_tokenizer(model_path)
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        self.engine: InferStrategy  # what this worker calls on it (roll.distributed.strategies.base)
        if canonical_name(strategy_name) == "hf_infer":
            model = load_policy(
                model_path, dtype=dtype, attn_implementation=attn_implementation, device=device, training=False
            ).to(device)  # type: ignore[arg-type]  # the stub of transformers' @wraps(Module.to) wants self
            pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
            self.engine = _hf_engine(model, pad, eos, max_cached_tokens, static_decode)
        else:
            self.engine = build_external_engine(strategy_name, model_path, dtype, eos, strategy_config or {})
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_ms / 1000.0
        # a vision-language model batches each engine call's requests, not continuously (hf/vl_generate.py)
        self.continuous = continuous_batching and serves_continuously(self.engine)
        if interrupt != "finish" and not self.continuous:
            raise ValueError(
                f"interrupt={interrupt!r} needs a continuous engine (hf or vllm, a text model, continuous_batching); "
                f"{strategy_name} finishes each engine call before a weight update"
            )
        self.interrupt = interrupt
        self.partial = PartialRequests(interrupt)  # requests interrupted and served again
        self.engine_name = strategy_name
        self.failed: EngineFailed | None = None  # set once the engine raised; see `_fail`
        self._pending: list[tuple[GenerateRequest, asyncio.Future, float]] = []  # + time.monotonic() it came
        self._pending_lock = threading.Lock()  # the engine thread takes from `_pending` (continuous)
        # taken by the engine, not answered: id(request) -> its futures (one request object may be sent twice)
        self._serving: dict[int, list[tuple[GenerateRequest, asyncio.Future]]] = {}
        self._drain_waiters = 0  # weight updates / offloads waiting for the engine call to end
        self._updates_waiting = 0  # of them, weight updates: only they interrupt (`interrupt`)
        self._engine_lock: asyncio.Lock | None = None
        self._awake: asyncio.Event | None = None  # cleared while the engine is offloaded
        self._arrived: asyncio.Event | None = None  # set by each new request (`batch_wait_ms`)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self._loop_task: asyncio.Task | None = None
        self.stats = {"engine_calls": 0, "requests": 0, "generated_tokens": 0}
        if weight_store is not None and ray.get_runtime_context().was_current_actor_reconstructed:
            self._restore_weights(weight_store)

    def _restore_weights(self, weight_store: str) -> None:
        """Restarted by Ray after this worker's process died: load the weights of the last sync
        (`roll.distributed.workers.weight_store`) before serving, so no request sees the initial
        model again."""
        box: list[ray.ObjectRef]
        version: int
        box, version = ray.get(ray.get_actor(weight_store).get.remote())
        if box:
            self.engine.load_weights(ray.get(box[0]), version)
        logger.warning("inference worker restarted: serving the weights of version %d", version)

    async def generate(self, request: GenerateRequest) -> GenerateOutput:
        _, _, arrived = self._ensure_loop()
        if self.failed is not None:  # a failed engine is never called again
            raise self.failed
        future = asyncio.get_running_loop().create_future()
        with self._pending_lock:
            self._pending.append((request, future, time.monotonic()))
        arrived.set()
        if self._loop_task is None or self._loop_task.done():
            loop = self._continuous_loop() if self.continuous else self._batch_loop()
            self._loop_task = asyncio.get_running_loop().create_task(loop)
        return await future

    async def generate_many(self, requests: list[GenerateRequest]) -> list[GenerateOutput]:
        """Several requests in one Ray call (an env worker's batch); each is served as if alone."""
        return list(await asyncio.gather(*(self.generate(r) for r in requests)))

    async def update_weights(self, state_dict: dict[str, torch.Tensor] | IpcWeights, version: int) -> int:
        """Load new actor weights between engine calls, never in the middle of one. With
        `interrupt` "finish" a batch already running finishes on the old weights (a continuous
        engine call admits no new request meanwhile, so no response mixes weights); "continue" and
        "abort" stop the running requests at the next token boundary instead (`_requeue`). Then the
        engine drops every cached conversation KV, which the new weights make stale. Requests
        still queued, and the continued ones, are served on the new weights and their tokens
        stamped with `version`."""
        self._ensure_loop()
        self._updates_waiting += 1
        counted = True
        try:
            async with self._between_engine_calls():
                self._updates_waiting, counted = self._updates_waiting - 1, False
                self._load(state_dict, version)
        finally:
            if counted:  # cancelled (or failed) before it had the engine
                self._updates_waiting -= 1
        return version

    def _load(self, state_dict: dict[str, torch.Tensor] | IpcWeights, version: int) -> None:
        """Under the engine lock: the weights into the engine (`update_weights`)."""
        _, awake, _ = self._ensure_loop()
        if not awake.is_set():
            raise RuntimeError("update_weights: the engine is offloaded; reload it first")
        with self.clock.measure("sync"):
            if isinstance(state_dict, IpcWeights):  # the actor's GPU tensors, shared: copied in, then let go
                tensors = state_dict.open()
                self.engine.load_weights(tensors, version)
                IpcWeights.close(tensors)
            else:
                self.engine.load_weights(state_dict, version)

    async def offload(self) -> None:
        """Free the device for a colocated role, after the engine call in progress."""
        _, awake, _ = self._ensure_loop()
        async with self._between_engine_calls():
            awake.clear()
            with self.clock.measure("sync"):
                self.engine.offload()

    async def reload(self) -> None:
        """Bring the engine back and serve the requests that waited."""
        lock, awake, _ = self._ensure_loop()
        async with lock:
            with self.clock.measure("sync"):
                self.engine.reload()
            awake.set()

    def memory_gib(self) -> dict[str, float]:
        """This process's GPU memory since the last call (`take_memory_gib`); zeros on CPU."""
        return take_memory_gib()

    def release_session(self, session_id: str) -> bool:
        """Drop a finished conversation's cached KV (safe while the engine runs); True if cached."""
        return self.engine.release(session_id)

    def release_sessions(self, session_ids: list[str]) -> int:
        """`release_session` for each id (an env worker's releases of one moment, in one call);
        how many were cached."""
        return sum(bool(self.engine.release(s)) for s in session_ids)

    def take_interruptions(self) -> dict[str, int]:
        """What weight updates (and offloads) did to running requests since the last call:
        `interrupted_requests`, `discarded_tokens`, `recomputed_tokens`."""
        return self.partial.take_counts()

    def get_stats(self) -> dict[str, int]:
        """Worker counters, the engine's own `stats`, the KV tokens roll caches for sessions (0 for
        engines that cache prefixes themselves) and the policy version served."""
        return dict(
            self.stats,
            **self.partial.counts,
            **self.engine.stats,
            kv_cached_tokens=self.engine.kv_cache.num_tokens,
            policy_version=self.engine.policy_version,
        )

    def _ensure_loop(self) -> tuple[asyncio.Lock, asyncio.Event, asyncio.Event]:
        """The engine lock and the awake and arrived events, made on first use: they belong to the
        actor's event loop."""
        if self._engine_lock is None or self._awake is None or self._arrived is None:
            self._engine_lock = asyncio.Lock()
            self._awake = asyncio.Event()
            self._awake.set()
            self._arrived = asyncio.Event()
        return self._engine_lock, self._awake, self._arrived

    async def _batch_loop(self) -> None:
        """Serve pending requests in batches until none is left, then end: the task lives only
        while there is work, so a worker shut down when idle leaves no pending task behind."""
        lock, awake, _ = self._ensure_loop()
        loop = asyncio.get_running_loop()
        while self._pending:
            await awake.wait()  # an offloaded engine serves nothing until `reload`
            await self._wait_for_a_fuller_batch()
            async with lock:
                if not awake.is_set():  # offloaded while this loop waited for the lock
                    continue
                with self._pending_lock:
                    batch = self._pending[: self.max_batch_size]
                    self._pending = self._pending[self.max_batch_size :]
                try:
                    with self.clock.measure("compute"):
                        outputs = await loop.run_in_executor(
                            self._executor, self.engine.generate_batch, [r for r, *_ in batch]
                        )
                except Exception as exc:
                    self._fail(batch, exc)
                    return
            self.stats["engine_calls"] += 1
            self.stats["requests"] += len(batch)
            for (_, fut, _), out in zip(batch, outputs):
                self.stats["generated_tokens"] += len(out.token_ids)
                if not fut.done():
                    fut.set_result(out)

    async def _continuous_loop(self) -> None:
        """Continuous batching (`strategies/hf/continuous.py`, `strategies/vllm_serve.py`): one
        engine call serves every request that arrives while it runs; each is answered the moment
        its row stops. The call ends when
        the engine is idle, or when a weight update or offload waits (`_drain_waiters`): then it
        takes no new request and returns once its running rows are done; with `interrupt` other
        than "finish" it returns at the next token boundary, and its running rows go back to the
        front of the queue (`_requeue`) before the update runs."""
        lock, awake, _ = self._ensure_loop()
        engine = self.engine
        serve = functools.partial(continuous.serve, engine) if isinstance(engine, HFInferStrategy) else engine.serve  # type: ignore[attr-defined]
        loop = asyncio.get_running_loop()

        # an offload lets the running rows finish (the weights stay): only a weight update interrupts
        stopping = (lambda: self._updates_waiting > 0) if self.interrupt != "finish" else (lambda: False)
        while self._pending:
            await awake.wait()
            await self._wait_for_a_fuller_batch()
            async with lock:
                if not awake.is_set():
                    continue
                try:
                    with self.clock.measure("compute"):
                        suspended = await loop.run_in_executor(
                            self._executor,
                            serve,
                            self._take,
                            lambda request, output: loop.call_soon_threadsafe(self._answer, request, output),
                            self.max_batch_size,
                            lambda: self._drain_waiters > 0,
                            stopping,
                        )
                except Exception as exc:
                    with self._pending_lock:
                        serving = [item for items in self._serving.values() for item in items]
                        self._serving = {}
                    self.partial.clear()
                    self._fail(serving, exc)
                    return
                self._requeue(suspended)  # under the lock: before the waiting update loads its weights
            self.stats["engine_calls"] += 1

    async def _wait_for_a_fuller_batch(self) -> None:
        """`batch_wait_ms`: the oldest pending request waits up to that long for company (less once
        `max_batch_size` are pending) before an engine call starts, so that requests arriving a
        moment apart share one prefill instead of each paying a model call of its own. A running
        continuous call applies the same rule at each decode step (`_take`)."""
        _, _, arrived = self._ensure_loop()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._oldest_wait_left()
        while len(self._pending) < self.max_batch_size and (remaining := deadline - loop.time()) > 0:
            arrived.clear()
            try:
                await asyncio.wait_for(arrived.wait(), remaining)
            except TimeoutError:
                return

    def _oldest_wait_left(self) -> float:
        """Seconds until the oldest pending request has waited `batch_wait_ms` (0 if none pends)."""
        with self._pending_lock:
            if not self._pending or self.batch_wait_s <= 0:
                return 0.0
            waited = time.monotonic() - self._pending[0][2]
        return max(0.0, self.batch_wait_s - waited)

    def _take(self, n: int) -> list[GenerateRequest]:
        """Engine thread: up to n pending requests, now being served; none while fewer than n
        pend and the oldest has waited less than `batch_wait_ms`."""
        if len(self._pending) < n and self._oldest_wait_left() > 0:
            return []
        with self._pending_lock:
            taken, self._pending = self._pending[:n], self._pending[n:]
            for r, fut, _ in taken:
                self._serving.setdefault(id(r), []).append((r, fut))
        return [r for r, *_ in taken]

    def _requeue(self, suspended: list[Suspended]) -> None:
        """Requests a weight update stopped mid-way go back to the front of the queue, in their
        order, as `self.partial` turns them (a continuation, or the request again)."""
        now = time.monotonic()
        front = [
            (request, self._untake(item.request), now)
            for item in suspended
            for request in [self.partial.resume(item, self.engine.policy_version)]
        ]
        with self._pending_lock:
            self._pending[:0] = front

    def _untake(self, request: GenerateRequest) -> asyncio.Future:
        """The future of a request taken by the engine and not answered; it is no longer served."""
        with self._pending_lock:
            waiting = self._serving[id(request)]
            _, fut = waiting.pop(0)
            if not waiting:
                del self._serving[id(request)]
        return fut

    def _answer(self, request: GenerateRequest, output: GenerateOutput) -> None:
        fut = self._untake(request)
        output = self.partial.whole(request, output)  # the rest of an interrupted request: answered whole
        self.stats["requests"] += 1
        self.stats["generated_tokens"] += len(output.token_ids)
        if not fut.done():
            fut.set_result(output)

    @contextlib.asynccontextmanager
    async def _between_engine_calls(self):
        """Hold the engine lock; a continuous engine call in progress is asked to wind down."""
        lock, _, _ = self._ensure_loop()
        self._drain_waiters += 1
        try:
            async with lock:
                yield
        finally:
            self._drain_waiters -= 1

    def _fail(self, batch: list, exc: Exception) -> None:
        """The engine raised: fail this batch and every queued request at once with its message."""
        self.failed = EngineFailed.of(self.engine_name, exc)
        logger.error("%s", self.failed, exc_info=exc)  # the full traceback goes to the worker's log
        with self._pending_lock:
            waiting, self._pending = batch + self._pending, []
        for _, fut, *_ in waiting:
            if not fut.done():
                fut.set_exception(self.failed)


WORKER_OPTIONS = ("max_batch_size", "max_cached_tokens", "num_replicas", "batch_wait_ms", "static_decode")
"""`strategy_config` keys the worker reads itself (see `roll/pipeline/setup/builders.py`), not engine options."""


def build_external_engine(
    name: str, model_path: str, dtype: str, eos_token_ids: list[int], strategy_config: dict
) -> InferStrategy:
    """The `vllm` or `sglang` engine (imported only when chosen: their packages are optional),
    given the rest of `strategy_config` as keyword options."""
    engine_cls = strategy_class(name, kind="infer")
    options = {k: v for k, v in strategy_config.items() if k not in WORKER_OPTIONS}
    options.setdefault("dtype", dtype)
    return engine_cls(model_path, eos_token_ids, **options)


def _hf_engine(
    model, pad_token_id: int, eos: list[int], max_cached_tokens: int, static_decode: bool | None
) -> HFInferStrategy:
    """The in-process transformers engine over `model`; a VL model's image tokens are never sampled."""
    return HFInferStrategy(
        model,
        pad_token_id=pad_token_id,
        eos_token_ids=eos,
        max_cached_tokens=max_cached_tokens,
        static_decode=static_decode,
        suppressed_token_ids=vision_token_ids(model.config),
    )


def serves_continuously(engine: InferStrategy) -> bool:
    """Whether `engine` serves requests as they come, interruptible at a token boundary: `hf` and
    `vllm` on a text model (a vision-language model's requests go in batches)."""
    if isinstance(engine, HFInferStrategy):
        return not engine.vision
    return bool(getattr(engine, "continuous", False))
