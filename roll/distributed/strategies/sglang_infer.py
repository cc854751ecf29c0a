"""`sglang` inference strategy: SGLang's offline `Engine` behind the `HFInferStrategy` interface.

UNTESTED HERE: SGLang needs CUDA and roll's machines are CPU-only; this module was written against
SGLang's public API (`sglang.Engine`, `Engine.generate`, `Engine.update_weights_from_tensor`) and
has never run. Check it on a GPU before relying on it.

Contract (as for `vllm`): token in, token out; ids and log-probs are read from the same
`output_token_logprobs` entries; log-probs are `log(softmax(logits / T))` over the full
vocabulary; each request's `seed` is its `sampling_seed` (deterministic inference on by default);
`load_weights` updates the running engine from tensors and flushes the radix cache; every engine
call runs on the thread that built the engine.

Details, and the checks to port from the vllm tests: docs/engines/sglang.md.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from roll.core.records import GenerateOutput, GenerateRequest
from roll.distributed.strategies.engine_api import EngineManagedCache, EngineUnavailable, generate_live

INSTALL_HINT = 'install it on a CUDA machine with `pip install "sglang[all]"` (no CPU build exists)'


def import_sglang():
    """The sglang module, or `EngineUnavailable` with one line when sglang or CUDA is missing."""
    if not torch.cuda.is_available():
        raise EngineUnavailable(f"the sglang strategy needs a CUDA GPU (none is visible here); {INSTALL_HINT}")
    try:
        import sglang
    except ImportError as exc:
        cause = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise EngineUnavailable(f"the sglang strategy needs sglang ({cause}); {INSTALL_HINT}") from exc
    return sglang


class SGLangInferStrategy:
    """SGLang engine for the inference worker; options come from `strategy_config` (all optional):

    - `dtype`: "bfloat16" for speed, "float32" to compare with the trainer exactly.
    - `mem_fraction_static`: fraction of GPU memory for weights and KV cache (SGLang picks one if
      None); lower it when a trainer shares the GPU.
    - `context_length`: longest prompt + response; None takes the model config's.
    - `enable_deterministic_inference` (default True): batch-invariant kernels and seeded
      sampling, needed for per-request seeds to reproduce.
    - `seed`: the engine's `random_seed`.
    - any other key goes to `sglang.Engine` as is (its `ServerArgs`, e.g. `attention_backend`).
    """

    def __init__(
        self,
        model_path: str,
        eos_token_ids: list[int],
        *,
        dtype: str = "bfloat16",
        mem_fraction_static: float | None = None,
        context_length: int | None = None,
        enable_deterministic_inference: bool = True,
        seed: int = 0,
        **engine_kwargs: Any,
    ):
        sglang = import_sglang()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sglang")
        options = dict(
            model_path=model_path,
            dtype=dtype,
            skip_tokenizer_init=True,
            random_seed=seed,
            enable_deterministic_inference=enable_deterministic_inference,
            **engine_kwargs,
        )
        if mem_fraction_static is not None:
            options["mem_fraction_static"] = mem_fraction_static
        if context_length is not None:
            options["context_length"] = context_length
        self.engine = self._call(sglang.Engine, **options)
        self.eos_token_ids = list(eos_token_ids)
        self.policy_version = 0
        self.kv_cache = EngineManagedCache()
        self.stats = {"prefix_tokens_reused": 0, "prefill_tokens": 0}

    def _call(self, fn, *args, **kwargs):
        """Run `fn` on the engine's own thread and wait for it."""
        return self._thread.submit(fn, *args, **kwargs).result()

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Load new weights in place and flush the radix cache (its KV is stale)."""
        result = self._call(self.engine.update_weights_from_tensor, list(state_dict.items()), flush_cache=True)
        ok, message = _success(result)
        if not ok:
            raise RuntimeError(f"sglang weight update failed: {message}")
        self.policy_version = version

    def release(self, session_id: str) -> bool:
        """No-op: SGLang's radix cache is keyed by token ids and evicts by itself."""
        return False

    def offload(self) -> None:
        """Free the GPU for a colocated role: flush the radix cache, then SGLang's
        `release_memory_occupation` (weights and KV cache). Needs the engine built with
        `enable_memory_saver=True`, which the pipeline adds to `strategy_config` when actor_infer
        shares GPUs. Written against SGLang's API, never run (see the module docstring)."""
        self._call(self.engine.flush_cache)
        self._call(self.engine.release_memory_occupation)

    def reload(self) -> None:
        """Undo `offload`: `resume_memory_occupation` brings weights and KV memory back."""
        self._call(self.engine.resume_memory_occupation)

    def generate_batch(self, requests: list[GenerateRequest]) -> list[GenerateOutput]:
        """All requests in one `Engine.generate` call (SGLang batches them continuously)."""
        return generate_live(requests, self._generate, self.policy_version)

    def _generate(self, requests: list[GenerateRequest]) -> list[GenerateOutput]:
        results = self._call(
            self.engine.generate,
            input_ids=[r.prompt_ids for r in requests],
            sampling_params=[self._sampling_params(r) for r in requests],
            return_logprob=True,
        )
        return [self._to_output(r, result) for r, result in zip(requests, results, strict=True)]

    def _sampling_params(self, request: GenerateRequest) -> dict[str, Any]:
        p = request.params
        return {
            "max_new_tokens": p.max_new_tokens,
            "temperature": 0.0 if p.greedy else p.temperature,
            "top_p": p.top_p,
            "top_k": p.top_k if p.top_k > 0 else -1,  # SGLang: -1 = whole vocabulary
            "stop_token_ids": sorted(p.stop_ids(self.eos_token_ids)),
            "ignore_eos": p.ignore_eos,
            "sampling_seed": request.seed,
        }

    def _to_output(self, request: GenerateRequest, result: dict) -> GenerateOutput:
        meta = result["meta_info"]
        reason = (meta.get("finish_reason") or {}).get("type")
        if reason not in ("stop", "length"):
            raise RuntimeError(f"sglang finished request {request.request_id} with {reason!r}")
        steps = meta["output_token_logprobs"]
        reused = int(meta.get("cached_tokens", 0))  # prompt ids served from the radix cache
        self.stats["prefix_tokens_reused"] += reused
        self.stats["prefill_tokens"] += len(request.prompt_ids) - reused
        return GenerateOutput(
            request.request_id, [int(s[1]) for s in steps], [float(s[0]) for s in steps], reason, self.policy_version
        )


def _success(result) -> tuple[bool, str]:
    """SGLang answers weight updates with (success, message) or an object/dict holding them."""
    if isinstance(result, tuple):
        return bool(result[0]), str(result[1]) if len(result) > 1 else ""
    if isinstance(result, dict):
        return bool(result.get("success", True)), str(result.get("message", ""))
    return bool(getattr(result, "success", True)), str(getattr(result, "message", ""))
