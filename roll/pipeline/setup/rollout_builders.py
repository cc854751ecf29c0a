"""The edge where config becomes the rollout side: env workers, the scheduler that drives them, and
the env specs and sampling parameters they take.

Like `roll.pipeline.setup.builders` (workers, Ray placement), only these functions read `PipelineConfig`;
the classes they build take plain arguments.
"""

from __future__ import annotations

import os
from typing import Any

import ray

from roll.agentic.episode import EnvSpec
from roll.agentic.rollout.env_worker import EnvWorker
from roll.agentic.rollout.scheduler import RolloutScheduler, Slot
from roll.configs.roll_compat.dialect import CONCAT_ENV_MANAGERS, NATIVE_ENV_MANAGERS, VL_ENV_MANAGERS
from roll.configs.worker import image_limit
from roll.core.records import SamplingParams
from roll.distributed.cpu_affinity import ENV_WORKERS
from roll.pipeline.setup import cluster
from roll.pipeline.setup.cpu_shares import pin_workers, role_share

# An env-worker process asks Ray for no CPU (as every actor, roll.pipeline.setup.builders), and one that
# dies (a segfaulting env, the OOM killer) is restarted by Ray, as often as it takes; the groups it
# was playing are replaced (`RolloutScheduler`).
ENV_WORKER_OPTIONS = {"num_cpus": 0, "max_restarts": -1}

FRAME_ENGINES = frozenset({"vllm"})
"""Inference strategies that run the model's processor on the raw images themselves, so VL
requests carry their frames (`EnvSpec.send_frames`)."""


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
    slot_tags = manager_cfg.slot_tags
    # max_env_num_per_worker counts envs; a worker holds whole groups (0 = everything in one worker)
    envs_per_group = manager_cfg.group_size + manager_cfg.group_size_redundancy
    per_worker = (
        max(1, manager_cfg.max_env_num_per_worker // envs_per_group)
        if manager_cfg.max_env_num_per_worker
        else len(slot_tags)
    )
    chunks = [slot_tags[i : i + per_worker] for i in range(0, len(slot_tags), per_worker)]
    sampling = sampling_params(cfg.generating_args_for(manager_cfg), tokenizer)
    workers, slots = [], []
    for w, tags in enumerate(chunks):
        specs = [env_spec(cfg, tag, manager_cfg) for tag in tags]
        workers.append(
            ray.remote(EnvWorker)
            .options(**_env_worker_options(manager_cfg.system_envs))
            .remote(
                specs,
                manager_cfg.group_size,
                cfg.actor_infer.model_args.model_name_or_path,
                inference,
                sampling,
                cfg.sequence_length,
                manager_type=manager_cfg.env_manager_type,
                history_length=manager_cfg.history_length,
                step_timeout_s=manager_cfg.env_step_timeout_s,
                generate_timeout_s=manager_cfg.generate_timeout_s,
                redundancy=manager_cfg.group_size_redundancy,
                chat_template=cfg.actor_infer.data_args.template,
                proxy=proxy_options(manager_cfg.proxy),
            )
        )
        slots += [Slot(worker=w, local=k, tag=tag) for k, tag in enumerate(tags)]
    ray.get(pin_workers(workers, [role_share(cfg, ENV_WORKERS)] * len(workers)))  # on the env workers' cores
    monitor = cfg.env_monitor
    hung_s = monitor.hung_timeout if monitor.enable else None
    return RolloutScheduler(
        workers,
        slots,
        seed=cfg.seed,
        mode=mode,
        group_size=manager_cfg.group_size,
        timeout_s=max(900.0, 2 * monitor.hung_timeout),  # no group at all finished: past a probe's restart
        hung_timeout_s=hung_s,
        rescue_rounds=manager_cfg.rescue_rounds,
        rescue_temperature=manager_cfg.rescue_temperature,
    )


def proxy_options(proxy) -> dict:
    """The env worker's chat-proxy options from `<manager>.proxy` (roll.configs.proxy)."""
    return {
        "model_names": (proxy.model_name,),
        "max_body_bytes": proxy.max_body_bytes,
        "episode_timeout_s": proxy.episode_timeout_s,
    }


def _env_worker_options(system_envs: dict[str, str]) -> dict:
    """Env workers on a cluster spread over its nodes (each asks no CPU, so every node qualifies);
    the manager's `system_envs` in their environment."""
    options: dict[str, Any] = (
        {**ENV_WORKER_OPTIONS, "scheduling_strategy": "SPREAD"} if cluster.joined() else dict(ENV_WORKER_OPTIONS)
    )
    if system_envs:
        options["runtime_env"] = {"env_vars": dict(system_envs)}
    return options


def env_spec(cfg, tag: str, manager_cfg=None) -> EnvSpec:
    """`custom_envs.<tag>` as the env managers take it, with `manager_cfg`'s defaults."""
    env = cfg.custom_envs[tag]
    env_config = dict(env.env_config)
    penalty = getattr(manager_cfg, "format_penalty", None)
    if penalty is not None and "format_penalty" not in env_config and _takes(env.env_type, "format_penalty"):
        env_config["format_penalty"] = penalty  # the manager's default (ROLL's key)
    if env.env_type == "agent" and env_config.get("dataset"):  # as the driver sees it: an env
        env_config["dataset"] = os.path.abspath(env_config["dataset"])  # worker may run elsewhere
    if env.tool_wrapper is not None:  # a GEM env's tools (envs/gem_envs/tools.py): built by the env
        env_config["tool_wrapper"] = env.tool_wrapper.model_dump()
    return EnvSpec(
        tag=tag,
        env_type=env.env_type,
        env_config=env_config,
        max_steps=env.max_steps,
        max_tokens_per_step=env.max_tokens_per_step,
        response_prefix=env.response_prefix,
        instruction=env.instruction,
        agent_system_template=env.agent_system_template,
        agent_template=env.agent_template,
        history_length=env.history_length,
        use_thread_lock=env.use_thread_lock,
        max_env_step_concurrent=env.max_env_step_concurrent,
        native_chat=env.env_manager_cls in NATIVE_ENV_MANAGERS,
        agent_runner_cls=env.agent_runner_cls,
        concat_history=env.env_manager_cls in CONCAT_ENV_MANAGERS,
        pre_step_template=env.pre_step_template,
        next_step_template=env.next_step_template,
        vision=env.env_manager_cls in VL_ENV_MANAGERS,
        max_images_per_prompt=image_limit("actor_infer", cfg.actor_infer.strategy_args.strategy_config),
        send_frames=cfg.actor_infer.strategy_args.strategy_name in FRAME_ENGINES,
    )


def _takes(env_type: str, key: str) -> bool:
    """Whether the env class of `env_type` accepts constructor argument `key`."""
    from roll.agentic.env.registry import check_env_config

    try:
        check_env_config(env_type, {key: 0.0})
    except (TypeError, ValueError, ImportError):
        return False
    return True
