"""The edge where config becomes objects: Ray, worker actors and rollout schedulers.

Classes below this line take plain arguments; only these functions read `PipelineConfig`.
"""

from __future__ import annotations

import logging
import os

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from roll.agentic.env_manager.base import EnvSpec
from roll.configs.dialect import MEGATRON_DIALECT_KEYS
from roll.agentic.rollout.env_worker import EnvWorker
from roll.agentic.rollout.records import SamplingParams
from roll.agentic.rollout.scheduler import RolloutScheduler, Slot
from roll.distributed.placement import DevicePlan, ProcessPlacement, plan_devices
from roll.distributed.rank_group import RankGroup
from roll.distributed.strategies.process_group import free_port
from roll.distributed.strategies.kv_cache import DEFAULT_MAX_CACHED_TOKENS
from roll.distributed.workers.actor import ActorWorker
from roll.distributed.workers.critic import CriticWorker
from roll.distributed.workers.inference import InferenceWorker
from roll.distributed.workers.reference import ReferenceWorker
from roll.pipeline.residency import PhaseResidency

logger = logging.getLogger(__name__)

# Every actor asks Ray for 0 CPUs: on a 2-core machine, actors that each hold a CPU while idle
# starve later tasks. The phases are sequential (rollout, then scoring, then training), so each
# worker uses all cores in its own phase through torch threads instead.
_ACTOR_OPTIONS = {"num_cpus": 0}
# An env-worker process that dies (a segfaulting env, the OOM killer) is restarted by Ray, as often
# as it takes; the groups it was playing are replaced (`RolloutScheduler`).
_ENV_WORKER_OPTIONS = {**_ACTOR_OPTIONS, "max_restarts": -1}
# What an external engine needs to be offloadable when actor_infer shares GPUs with training roles.
_OFFLOADABLE_ENGINE_OPTIONS = {"vllm": {"enable_sleep_mode": True}, "sglang": {"enable_memory_saver": True}}


def init_ray(address: str | None, system_envs: dict[str, str] | None = None) -> None:
    """Start (or join) Ray; `system_envs` (ROLL's key) are set in the driver and, through the job's
    runtime_env, in every worker process."""
    if ray.is_initialized():
        return
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.update(system_envs or {})
    runtime_env = {"env_vars": dict(system_envs)} if system_envs else None
    if address:
        ray.init(address=address, logging_level="ERROR", runtime_env=runtime_env)
    else:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR",
                 runtime_env=runtime_env)


def place_workers(cfg) -> DevicePlan:
    """Where each worker process of the run goes on this machine (`roll.distributed.placement`);
    `PlacementError` naming the key when the layout does not fit the GPUs the driver sees."""
    layout = cfg.device_layout
    visible = 0
    if any(layout["mappings"].values()):  # a CPU run never touches CUDA
        import torch

        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return plan_devices(**layout, visible_gpus=visible, driver_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))


def inference_names(cfg) -> list[str]:
    """The inference workers' actor names in this driver's Ray job, one per replica
    (`cfg.inference_replicas`). Env workers get the
    names, not the handles: a handle among an actor's constructor arguments lives in Ray's object
    store, which a restart of that actor depends on (Ray warns about it); a name is looked up afresh."""
    job = ray.get_runtime_context().get_job_id()
    return [f"roll-inference-{job}-{i}" for i in range(cfg.inference_replicas)]


def build_workers(cfg, residency: PhaseResidency | None = None) -> dict:
    """Actor and (when needed) reference and critic actors (a `RankGroup` for a role of several
    ranks), then the inference replicas (a list), by worker key, each process on its device
    (`residency.plan`; `place_workers` when no `residency` is given). Training roles that share GPUs with the engine are offloaded before it
    is built, so that vLLM and SGLang find free the memory they size their KV cache from."""
    residency = residency or PhaseResidency(place_workers(cfg))
    plan, total = residency.plan, cfg.max_steps
    workers = {"actor": _start_role(ActorWorker, plan, "actor_train", cfg.actor_train.model_args.model_name_or_path,
                                    cfg.actor_train.training_args, total_train_steps=total, seed=cfg.seed,
                                    dtype=cfg.actor_train.model_args.dtype, system_envs=cfg.actor_train.system_envs,
                                    **_strategy(cfg.actor_train))}
    if "reference" in plan.processes:
        workers["reference"] = _start_role(
            ReferenceWorker, plan, "reference", cfg.reference.model_args.model_name_or_path,
            dtype=cfg.reference.model_args.dtype, system_envs=cfg.reference.system_envs,
            micro_batch_size=cfg.reference.infer_batch_size or cfg.reference.training_args.per_device_train_batch_size)
    if "critic" in plan.processes:
        workers["critic"] = _start_role(
            CriticWorker, plan, "critic", cfg.critic.model_args.model_name_or_path, cfg.critic.training_args,
            total_train_steps=total, seed=cfg.seed, dtype=cfg.critic.model_args.dtype,
            system_envs=cfg.critic.system_envs, **_strategy(cfg.critic))
    residency.attach_workers(workers)
    residency.enter("rollout")  # no call unless a training role shares the engine's GPUs
    infer_cfg = cfg.actor_infer
    options = infer_cfg.strategy_args.strategy_config
    workers["inference"] = [_remote(InferenceWorker, placement, name=name,
                                    runtime_env_vars=infer_cfg.system_envs).remote(
        infer_cfg.model_args.model_name_or_path, dtype=infer_cfg.model_args.dtype,
        max_batch_size=int(options.get("max_batch_size", 256)),
        max_cached_tokens=int(options.get("max_cached_tokens", DEFAULT_MAX_CACHED_TOKENS)),
        device=placement.torch_device, **_strategy(infer_cfg, offloadable=plan.is_colocated("actor_infer")))
        for placement, name in zip(plan.processes["actor_infer"], inference_names(cfg), strict=True)]
    residency.attach("actor_infer", workers["inference"])
    return workers


def _start_role(cls, plan: DevicePlan, role: str, *args, system_envs: dict[str, str] | None = None, **kwargs):
    """The actor of a one-process role, exactly as before ranks existed; for several ranks one
    actor per rank, forming one torch.distributed group, behind a `RankGroup`. The group is served
    on a free port of the driver's node, which every rank is pinned to; CPU ranks share the cores.
    `system_envs`: the role's own environment variables (ROLL's worker-level key)."""
    placements = plan.processes[role]
    if len(placements) == 1:
        return _remote(cls, placements[0], runtime_env_vars=system_envs).remote(
            *args, device=placements[0].torch_device, **kwargs)
    port, ranks = free_port(), len(placements)
    threads = None if placements[0].device is not None else max(1, (os.cpu_count() or 1) // ranks)
    return RankGroup([_remote(cls, p, env=p.rank_env(ranks, port), runtime_env_vars=system_envs).remote(
        *args, device=p.torch_device, num_threads=threads, **kwargs) for p in placements])


def _remote(cls, placement: ProcessPlacement, env: dict[str, str] | None = None,
            runtime_env_vars: dict[str, str] | None = None, **options):
    """`ray.remote(cls)` with the process's device options and extra environment `env`; a GPU
    process or a rank of a group is pinned to the driver's node (its GPUs, the group's port).
    `runtime_env_vars` only add variables (no pinning)."""
    options = {**_ACTOR_OPTIONS, **placement.ray_options(), **options}
    extra = {**(runtime_env_vars or {}), **(env or {})}
    if extra:
        runtime_env = options.setdefault("runtime_env", {})
        runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), **extra}
    if placement.device is not None or env:
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
            ray.get_runtime_context().get_node_id(), soft=False)
    return ray.remote(cls).options(**options)


def _strategy(worker_cfg, offloadable: bool = False) -> dict:
    """Engine name and options; `offloadable` adds what an external engine needs to be offloaded."""
    name = worker_cfg.strategy_args.strategy_name
    config = dict(worker_cfg.strategy_args.strategy_config)
    if name == "megatron":  # ROLL's keys checked by the dialect: 1-only sizes and memory-only options
        for key in MEGATRON_DIALECT_KEYS:
            config.pop(key, None)
    if offloadable:
        config.update(_OFFLOADABLE_ENGINE_OPTIONS.get(name, {}))
    return {"strategy_name": name, "strategy_config": config}


def sampling_params(generating_args, tokenizer) -> SamplingParams:
    """Stop strings must each be one token of the tokenizer (checked here, once)."""
    stop_ids = []
    for s in generating_args.stop_strings:
        ids = tokenizer.encode(s, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"generating_args.stop_strings: {s!r} is not a single token ({ids})")
        stop_ids.append(ids[0])
    return generating_args.to_sampling_params(None, stop_ids)


def build_rollout(cfg, manager_cfg, inference, tokenizer, mode: str) -> RolloutScheduler:
    """Env workers for one env manager config (train or val) and the scheduler that drives them.
    `inference`: the inference workers' names (`inference_names(cfg)`) or handles, or one of them."""
    slot_tags = [tag for tag, n in manager_cfg.groups_per_tag.items() for _ in range(n)]
    # max_env_num_per_worker counts envs; a worker holds whole groups (0 = everything in one worker)
    envs_per_group = manager_cfg.group_size + manager_cfg.group_size_redundancy
    per_worker = (max(1, manager_cfg.max_env_num_per_worker // envs_per_group)
                  if manager_cfg.max_env_num_per_worker else len(slot_tags))
    chunks = [slot_tags[i:i + per_worker] for i in range(0, len(slot_tags), per_worker)]
    sampling = sampling_params(cfg.generating_args_for(manager_cfg), tokenizer)
    workers, slots = [], []
    for w, tags in enumerate(chunks):
        specs = [_env_spec(cfg, tag, manager_cfg) for tag in tags]
        workers.append(ray.remote(EnvWorker).options(**_ENV_WORKER_OPTIONS).remote(
            specs, manager_cfg.group_size, cfg.actor_infer.model_args.model_name_or_path, inference,
            sampling, cfg.sequence_length, manager_type=manager_cfg.env_manager_type,
            history_length=manager_cfg.history_length, step_timeout_s=manager_cfg.env_step_timeout_s,
            generate_timeout_s=manager_cfg.generate_timeout_s, redundancy=manager_cfg.group_size_redundancy,
            chat_template=cfg.actor_infer.data_args.template))
        slots += [Slot(worker=w, local=k, tag=tag) for k, tag in enumerate(tags)]
    return RolloutScheduler(workers, slots, seed=cfg.seed, mode=mode, group_size=manager_cfg.group_size)


def _env_spec(cfg, tag: str, manager_cfg=None) -> EnvSpec:
    env = cfg.custom_envs[tag]
    env_config = dict(env.env_config)
    penalty = getattr(manager_cfg, "format_penalty", None)
    if penalty is not None and "format_penalty" not in env_config and _takes(env.env_type, "format_penalty"):
        env_config["format_penalty"] = penalty  # the manager's default (ROLL's key)
    if env.env_type == "agent" and env_config.get("dataset"):  # as the driver sees it: an env
        env_config["dataset"] = os.path.abspath(env_config["dataset"])  # worker may run elsewhere
    return EnvSpec(tag=tag, env_type=env.env_type, env_config=env_config,
                   max_steps=env.max_steps, max_tokens_per_step=env.max_tokens_per_step,
                   response_prefix=env.response_prefix, instruction=env.instruction,
                   agent_system_template=env.agent_system_template, agent_template=env.agent_template,
                   history_length=env.history_length, use_thread_lock=env.use_thread_lock,
                   max_env_step_concurrent=env.max_env_step_concurrent)


def _takes(env_type: str, key: str) -> bool:
    """Whether the env class of `env_type` accepts constructor argument `key`."""
    from roll.agentic.env.registry import check_env_config

    try:
        check_env_config(env_type, {key: 0.0})
    except (TypeError, ValueError, ImportError):
        return False
    return True
