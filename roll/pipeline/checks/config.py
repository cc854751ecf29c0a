"""Checks of the config's values that config validation must not do (configs are data): they
import envs (env types and their `env_config` keys), read files (an agent dataset, a runner), or
plan processes (LoRA targets, the megatron layout, CPU affinity). Run before anything starts.

`check_before_start(cfg)` raises `ConfigError` naming the key at fault, so the CLI reports it as
a config error (one line, exit status 2) before Ray, torch or a model is touched; the pipeline
runs it again when built directly. The GPU count is checked later, when the workers are placed
(`roll.pipeline.setup.builders.place_workers`).
"""

from __future__ import annotations

from roll.agentic.env.registry import check_env_config, resolve_env_class
from roll.configs.base import ConfigError, InvalidField
from roll.configs.env import CustomEnvConfig
from roll.configs.pipeline import PipelineConfig
from roll.configs.worker import WorkerConfig, cpu_options, engine_options
from roll.distributed.cpu_affinity import usable_cores
from roll.distributed.placement import PlacementError, check_device_layout
from roll.distributed.strategies.megatron.lora import megatron_targets
from roll.distributed.strategies.megatron.parallel import PARALLEL_KEYS, check_parallel_config
from roll.models.lora import unmatched_lora_target


def check_before_start(cfg: PipelineConfig) -> None:
    """Every env type and its `env_config` (agent datasets included), then the device layout of
    the roles the run builds, as far as it can be checked without a GPU."""
    try:
        check_env_types(cfg.custom_envs)
        for role, worker in cfg.workers.items():
            check_lora_target(role, worker)
            if worker.strategy_args.strategy_name == "megatron":
                check_megatron_layout(role, worker)
            check_cpu_affinity(role, worker)
        check_device_layout(**cfg.device_layout, async_generation_ratio=cfg.async_generation_ratio)
    except (InvalidField, PlacementError) as err:
        raise ConfigError(err.key, err.reason) from None


def check_lora_target(role: str, worker: WorkerConfig) -> None:
    """`InvalidField` naming `model_args.lora_target` when a listed module matches nothing in the
    role's model (read on the meta device: no weights are loaded), or, on megatron, has no
    counterpart among its fused layers. Nothing to do without LoRA."""
    lora = worker.model_args.lora
    if lora is None or worker.model_args.model_name_or_path is None:
        return
    if worker.strategy_args.strategy_name == "megatron":  # targets name megatron's fused layers
        try:
            megatron_targets(lora["target"])
        except ValueError as error:
            raise InvalidField(f"{role}.model_args.lora_target", str(error)) from None
        return
    missing = unmatched_lora_target(worker.model_args.model_name_or_path, lora["target"], value_model=role == "critic")
    if missing:
        raise InvalidField(f"{role}.model_args.lora_target", missing)


def check_megatron_layout(role: str, worker: WorkerConfig) -> None:
    """ROLL's parallel keys of `megatron`: values that are not built and a `world_size` that the
    model-parallel size does not divide stop here, naming the key. The reference role runs the HF
    model for its log-probs whatever its engine (roll.distributed.workers.reference), so model
    parallelism there would be silently ignored: refused instead."""
    options = engine_options(worker.strategy_args.strategy_config)
    assert worker.world_size is not None  # WorkerConfig's validator fills it
    try:
        check_parallel_config(worker.world_size, **{k: v for k, v in options.items() if k in PARALLEL_KEYS})
    except ValueError as error:
        key, why = str(error).split(": ", 1)
        raise InvalidField(f"{role}.strategy_args.{key}", why) from None
    for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size"):
        if role == "reference" and options.get(key, 1) > 1:
            raise InvalidField(
                f"{role}.strategy_args.strategy_config.{key}",
                "the reference computes log-probs with the HF model on each rank; "
                "model parallelism is built for actor_train only",
            )


def check_cpu_affinity(role: str, worker: WorkerConfig) -> None:
    """`cpu_affinity` may name only cores this machine lets the run use (its affinity mask). On a
    Ray cluster the workers' nodes may differ; the driver's machine is what is checked here."""
    cores, _ = cpu_options(role, worker)
    missing = sorted(set(cores or ()) - set(usable_cores()))
    if missing:
        raise InvalidField(
            f"{role}.strategy_args.strategy_config.cpu_affinity",
            f"core(s) {missing} are not usable here (usable: {list(usable_cores())})",
        )


def check_env_types(custom_envs: dict[str, CustomEnvConfig]) -> None:
    """Resolve every `env_type` and check its `env_config` keys now, so a typo fails before Ray
    starts rather than when the first env worker builds its envs."""
    for tag, env in custom_envs.items():
        if env.env_type == "agent":
            for key in ("instruction", "response_prefix"):  # agents format their own prompts
                if key in env.model_fields_set:
                    raise InvalidField(
                        f"custom_envs.{tag}.{key}",
                        "not used by env_type 'agent' (set system_prompt in the agent config)",
                    )
            _check_agent_dataset(f"custom_envs.{tag}.env_config", env.env_config)
            continue
        if env.agent_runner_cls is not None:
            _check_runner(f"custom_envs.{tag}.agent_runner_cls", env.agent_runner_cls)
        try:
            resolve_env_class(env.env_type)
        except (ValueError, ImportError) as err:
            raise InvalidField(f"custom_envs.{tag}.env_type", str(err)) from None
        for key, value in env.env_config.items():
            _check_env_config_key(f"custom_envs.{tag}.env_config", env.env_type, key, value)


def _check_runner(where: str, path: str) -> None:
    """The agent runner class imports and is a class with `run_job` (roll.agentic.proxy.runner)."""
    from roll.agentic.env_manager.proxy_env_manager import runner_class

    try:
        cls = runner_class(path)
    except (LookupError, ValueError, ImportError) as err:  # ObjectNotFound is a LookupError
        raise InvalidField(where, f"{path!r} cannot be imported ({err})") from None
    if not (isinstance(cls, type) and callable(getattr(cls, "run_job", None))):
        raise InvalidField(where, f"{path!r} is not an agent runner class (no run_job)")


def _check_env_config_key(where: str, env_type: str, key: str, value: object) -> None:
    """`InvalidField` naming `where.key` when the env's constructor has no argument `key`, or
    naming the bad field of a `fault_injection` block. One key at a time, so that the error can
    name the key at fault."""
    try:
        check_env_config(env_type, {key: value})
    except TypeError as err:  # the constructor has no such argument
        raise InvalidField(f"{where}.{key}", str(err)) from None
    except InvalidField as err:  # a bad field of the fault_injection block
        raise InvalidField(f"{where}.{err.key}", err.reason) from None


def _check_agent_dataset(where: str, env_config: dict) -> None:
    """`env_type: agent`: the dataset file, each row's agent and each agent config, checked now
    (`roll.agentic.agent_loop.dataset`); the error names the env_config key at fault."""
    # imported only for an agent env: the agent stack pulls in torch and transformers (seconds)
    from roll.agentic.agent_loop.dataset import AgentDatasetError, check_agent_env_config

    try:
        check_agent_env_config(env_config)
    except AgentDatasetError as err:
        raise InvalidField(f"{where}.{err.key}", err.reason) from None
