"""The ROLL config dialect: ROLL's agentic YAML keys that have no twin among our own fields.

A config written for ROLL's agentic pipeline validates here unchanged. Three kinds of key:
- fields of `RollDialect` (a base of `PipelineConfig`): ROLL's run-level keys with their meaning;
- hydra variables of ROLL's env library (`custom_env`, `action_pattern`, `max_actions_per_traj`,
  `*_format_penalty`, ...): ROLL's dataclasses ignore them, they exist to be `${...}`-interpolated.
  Known ones are fields below (so a typo gets a did-you-mean); any other top-level key that the
  YAML interpolates somewhere is a variable too (`strip_variables`);
- class paths (`worker_cls`, `env_manager_cls`): ROLL's and ours map to our classes; any other
  path is a one-line error.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator

from roll.configs.base import ConfigModel, InvalidField
from roll.configs.correction import TrainInferCorrection
from roll.configs.rollout import RolloutMock
from roll.configs.tracking import TrackerKwargs, check_tracker

ENV_MANAGER_CLASSES: dict[str, str | None] = {
    "roll.pipeline.agentic.env_manager.traj_env_manager.TrajEnvManager": "traj",
    "roll.pipeline.agentic.env_manager.step_env_manager.StepEnvManager": "step",
    "roll.agentic.env_manager.traj_env_manager.TrajEnvManager": "traj",
    "roll.agentic.env_manager.step_env_manager.StepEnvManager": "step",
    "roll.pipeline.agentic.env_manager.agent_native_env_manager.AgentNativeStepEnvManager": "step",
    "roll.agentic.env_manager.native_env_manager.NativeStepEnvManager": "step",
    "roll.pipeline.agentic.env_manager.step_concat_env_manager.StepConcatEnvManager": "step",
    "roll.pipeline.agentic.env_manager.vl_traj_env_manager.VLTrajEnvManager": None,
    "roll.agentic.env_manager.vl_traj_env_manager.VLTrajEnvManager": None,
    "roll.agentic.env_manager.vl_step_env_manager.VLStepEnvManager": "step",
    "traj": "traj",
    "step": "step",
    "native": "step",
}
"""`custom_envs.<Tag>.env_manager_cls` -> our env manager type; None: the type of the managers
running the tag (`env_manager_type`). ROLL has no step-wise VL manager, so its `VLTrajEnvManager`
marks a tag as VL and the sample mode picks the manager: trajectory-wise, or step-wise
(`roll.agentic.env_manager.vl_step_env_manager`)."""
NATIVE_ENV_MANAGERS = frozenset(
    {
        "roll.pipeline.agentic.env_manager.agent_native_env_manager.AgentNativeStepEnvManager",
        "roll.agentic.env_manager.native_env_manager.NativeStepEnvManager",
        "native",
    }
)
"""Of those, the step-wise managers whose prompt is the env's own chat (`native_env_manager`)."""
PROXY_ENV_MANAGERS = frozenset(
    {
        "roll.pipeline.agentic.env_manager.proxy_env_manager.ProxyEnvManager",
        "roll.agentic.env_manager.proxy_env_manager.ProxyEnvManager",
        "proxy",
    }
)
"""`env_manager_cls` of tags played by an agent runner through the chat proxy; their samples are
trajectory- or step-wise as the manager's `env_manager_type` says (ROLL's default: trajectory)."""
_RUNNER_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*[.:][A-Za-z_]\w*")
VL_ENV_MANAGERS = frozenset(
    {
        "roll.pipeline.agentic.env_manager.vl_traj_env_manager.VLTrajEnvManager",
        "roll.agentic.env_manager.vl_traj_env_manager.VLTrajEnvManager",
        "roll.agentic.env_manager.vl_step_env_manager.VLStepEnvManager",
    }
)
"""Of those, the managers for vision-language models: image observations, trajectory- or
step-wise (`roll.agentic.env_manager.vl_traj_env_manager`, `vl_step_env_manager`)."""
CONCAT_ENV_MANAGERS = frozenset({"roll.pipeline.agentic.env_manager.step_concat_env_manager.StepConcatEnvManager"})
"""Of those, ROLL's step-wise manager for GEM: `{history}` is the earlier observations, one per
line, instead of "(step: N, observation: ..., action: ..., reward: ...)" entries."""

WORKER_CLASSES = {
    "roll.pipeline.agentic.agentic_actor_worker.ActorWorker": ("actor_train", "reference"),
    "roll.pipeline.agentic.agentic_actor_pg_worker.ActorWorker": ("actor_train",),
    "roll.pipeline.rlvr.actor_pg_worker.ActorPGWorker": ("actor_train",),
    "roll.pipeline.base_worker.ActorWorker": ("actor_train", "reference"),
    "roll.pipeline.base_worker.InferWorker": ("actor_infer",),
    "roll.pipeline.base_worker.CriticWorker": ("critic",),
    "roll.distributed.workers.actor.ActorWorker": ("actor_train",),
    "roll.distributed.workers.inference.InferenceWorker": ("actor_infer",),
    "roll.distributed.workers.reference.ReferenceWorker": ("reference",),
    "roll.distributed.workers.critic.CriticWorker": ("critic",),
}
"""`<role>.worker_cls` -> the roles our worker of that class serves. ROLL's PG-variant actor
classes are its actor with another loss; the loss itself is chosen by `pg_variant`."""

_FORMAT_PENALTY_VARIABLE = re.compile(r"\w+_format_penalty")


class CheckpointConfig(ConfigModel):
    """ROLL's `checkpoint_config`: where checkpoints are written."""

    type: Literal["file_system"] = "file_system"
    """Only "file_system" (ROLL's default); its other types are object stores."""
    output_dir: str | None = None
    """Checkpoints go under `output_dir/checkpoints/step_N/` of this dir; None: the top-level
    `output_dir`."""


class EnvMonitorConfig(ConfigModel):
    """ROLL's env monitor: how long a group of episodes may run before its env worker is checked.
    Every env call and generate has its own bound (`env_step_timeout_s`, `generate_timeout_s`); a
    group past `hung_timeout` gets its env worker probed: a worker that answers is logged as slow,
    one that does not answer is stuck (a blocked event loop) and is restarted, its groups played
    again (`roll.agentic.rollout.scheduler`). ROLL only logs such envs."""

    enable: bool = True
    """False: no group deadline (the per-call bounds and the rollout's own timeout still hold)."""
    hung_timeout: float = Field(900.0, gt=0)
    """Seconds a group may run before its env worker is probed. ROLL's default is 3600."""


class RollDialect(ConfigModel):
    """ROLL's run-level keys (fields of `PipelineConfig`, through this base)."""

    system_envs: dict[str, str] = Field(default_factory=dict)
    """Environment variables set in the driver and in every worker process (Ray runtime_env)."""
    track_with: Literal["tensorboard", "wandb", "mlflow", "stdout", "swanlab", "trackio"] = "tensorboard"
    """Where metrics go besides `metrics.jsonl` and the TensorBoard events (written in every case):
    "tensorboard" (events under `tracker_kwargs.log_dir`, else `logging_dir`), "wandb" (offline
    files under `output_dir` unless `tracker_kwargs.mode` is online), "mlflow" (a SQLite store
    under `output_dir` unless `tracker_kwargs.tracking_uri` says otherwise), "swanlab" (offline
    files under `output_dir/swanlog` unless `tracker_kwargs.mode` is online), "trackio" (a SQLite
    file under `output_dir/trackio` unless `tracker_kwargs.space_id` names a Space) or "stdout"
    (one JSON line per logged step). docs/trackers.md."""
    tracker_kwargs: TrackerKwargs = Field(default_factory=TrackerKwargs)
    """Arguments of the `track_with` backend."""
    checkpoint_config: CheckpointConfig = Field(default_factory=CheckpointConfig)
    """Where checkpoints are written."""
    num_gpus_per_node: int | None = Field(None, ge=0)
    """GPUs of one node. On a cluster (`ray_address`), `device_mapping` index d is GPU
    d % num_gpus_per_node of the cluster's GPU node d // num_gpus_per_node, as in ROLL
    (`roll.distributed.cluster_plan`; None there: the one GPU count of the cluster's GPU nodes).
    In a local run every index must be below it; None: not checked here (the visible GPUs are
    checked at start)."""
    max_grad_norm: float | None = Field(None, gt=0)
    """ROLL's run-level gradient clip: the `training_args.max_grad_norm` of every trained role
    that does not set its own. None: each role's own."""
    batch_adjust_mode: Literal["copy", "delete", "auto", "random_sample"] | None = "copy"
    """ROLL's rule for a training batch that is not a whole number of mini-batches (the least
    common multiple of every role's rows per optimizer step and per forward-only call): "copy"
    duplicates rows up to the next multiple, "delete" drops the remainder, "auto" deletes unless the
    batch is smaller than one multiple, "random_sample" keeps one multiple's worth of random rows
    (roll.algorithms.batch_adjust). Applied to the scored batch, so copies carry their originals'
    advantages (ROLL adjusts before its advantages); draws derive from `seed` and the step. null
    (ours, not ROLL's): the batch is trained as it is; our trainers take a short last mini-batch,
    so nothing needs copying, which is what this project's examples use (a step-wise FrozenLake
    batch of ~750 rows would otherwise be copied up to 1024)."""
    enable_old_logprobs_recompute: bool = False
    """ROLL's switch for the PPO old log-probs. false (ROLL's default): the actor takes them in its
    training call, the first mini-batch's from its first optimizer step's own forward and the other
    rows' from one pass just before that step (`roll.distributed.workers.old_logprobs`), so the
    score phase runs no actor pass; ROLL does so only when a step is one mini-batch. true: a pass of
    their own in the score phase. Both give the same numbers up to float rounding. A run whose
    rewards carry the KL penalty (it needs them before the advantages) or whose actor trains with
    megatron takes the pass either way, as do `critic_warmup` steps (for the engine-gap metric);
    the driver logs why at start (`old_logprobs_pass_needed`)."""
    force_disable_old_logprobs_recompute: bool = False
    """ROLL's override of `enable_old_logprobs_recompute`: true takes the old log-probs in the
    training call even when that key is true; a run that cannot (a KL penalty in the rewards, a
    megatron actor) is refused at start."""
    train_infer_correction: TrainInferCorrection | None = None
    """ROLL's importance weights and token filters from the trainer/engine log-prob gap
    (`roll.algorithms.train_infer`). Not together with `off_policy_correction` (the same weight
    twice)."""
    rollout_dump_dir: str | None = None
    """ROLL's key: each step's trajectories are written to
    `rollout_dump_dir/rollout_dump_data.step_N.jsonl` (validations: `...val_step_N.jsonl`), one
    JSON line per trajectory as `roll.tracking.traces` records it (decoded turns, rewards, stop
    reason). ROLL writes only absolute paths and only for some env managers; roll writes any path
    for every manager. None: nothing is written."""
    rollout_mock: RolloutMock | None = None
    """ROLL's rollout dump/mock: record each step's rollout, or replay a recording
    (`roll.configs.rollout.RolloutMock`)."""
    rpc_timeout: float | None = Field(None, gt=0)
    """ROLL's key: seconds the driver waits for one call on a worker (a scoring pass, a training
    step, a weight sync, a checkpoint) before the run stops with an error. None: 1800."""
    env_monitor: EnvMonitorConfig = Field(default_factory=EnvMonitorConfig)
    """ROLL's key: the group deadline that finds a stuck env worker (`EnvMonitorConfig`)."""
    max_ckpt_to_keep: int = Field(0, ge=0)
    """ROLL's key: keep the newest N complete checkpoints, deleting older ones after each save
    (`roll.pipeline.phases.checkpoint.prune`); the newest, which a resume reads, is never deleted. 0 keeps all."""
    whiten_rewards: bool = False
    """ROLL's key: whiten the token rewards (after the KL penalty) over the batch's response tokens,
    (r - mean) / std, before the estimator (trajectory-wise samples; skipped with fewer than two
    response tokens, as ROLL)."""
    add_token_level_kl: bool | None = None
    """ROLL's key. true: the KL penalty (`init_kl_coef` / `target_kl`) is subtracted from the token
    rewards; false: the KL to the reference is measured (`critic/kl`) and the rewards keep no
    penalty, as ROLL. None (roll's default): the penalty is on whenever `init_kl_coef > 0` or
    `target_kl` is set."""
    critic_warmup: int = Field(0, ge=0)
    """ROLL's key: the first `critic_warmup` training steps train the critic only; the actor's
    weights (and so the rollouts) stay those of the start."""
    dual_clip_loss: bool = False
    """ROLL's key: dual-clip PPO. Where the advantage is negative, the token loss is capped at
    c * |A| with ROLL's c = 1 + 2 * pg_clip (`roll.algorithms.losses.ppo_policy_loss`); pg_variant
    ppo only."""
    profiler_memory: bool = False
    """ROLL's CUDA memory-snapshot profiler (`torch.cuda.memory._record_memory_history`); roll has
    none, so only false is accepted."""
    profiler_timeline: bool = False
    """ROLL's torch-profiler timeline of each step; roll has none, so only false is accepted."""
    # ROLL's env-library variables: only used through ${...} interpolation.
    custom_env: dict[str, Any] | None = None
    """ROLL env-library variable: the env definitions `custom_envs` interpolates from."""
    action_pattern: str | None = None
    """ROLL env-library variable: regex of an action (interpolated into env_config)."""
    think_action_pattern: str | None = None
    """ROLL env-library variable: regex of a think + action answer."""
    all_response_pattern: str | None = None
    """ROLL env-library variable: regex of a free answer."""
    max_actions_per_traj: int | None = None
    """ROLL env-library variable: interpolated into `custom_envs.<Tag>.max_steps`."""
    max_tokens_per_step: int | None = None
    """ROLL env-library variable: interpolated into `custom_envs.<Tag>.max_tokens_per_step`."""
    default_history_length: int | None = None
    """ROLL env-library variable: interpolated into `custom_envs.<Tag>.history_length`."""
    env_manager_cls: str | None = None
    """ROLL env-library variable: interpolated into `custom_envs.<Tag>.env_manager_cls`."""
    agent_runner_cls: str | None = None
    """ROLL env-library variable: interpolated into `custom_envs.<Tag>.agent_runner_cls`."""
    agent_system_template: str | None = None
    """ROLL env-library variable: interpolated into `custom_envs.<Tag>.agent_system_template`."""
    agent_template: str | None = None
    """ROLL env-library variable: interpolated into `custom_envs.<Tag>.agent_template`."""
    single_prompt_agent_system_template: str | None = None
    """ROLL env-library variable (single-prompt envs)."""
    single_prompt_agent_template: str | None = None
    """ROLL env-library variable (single-prompt envs)."""

    @field_validator("profiler_memory", "profiler_timeline")
    @classmethod
    def _no_profiler(cls, on: bool, info) -> bool:
        if on:
            what = {"profiler_memory": "CUDA memory snapshots", "profiler_timeline": "a torch-profiler timeline"}
            raise ValueError(
                f"ROLL's profiler of {what[info.field_name]}; roll has no such profiler (set false; "
                "roll's step timings are the time/*_s metrics)"
            )
        return on


ENV_LIBRARY_VARIABLES = frozenset(
    {
        "custom_env",
        "action_pattern",
        "think_action_pattern",
        "all_response_pattern",
        "max_actions_per_traj",
        "max_tokens_per_step",
        "default_history_length",
        "env_manager_cls",
        "agent_runner_cls",
        "agent_system_template",
        "agent_template",
        "single_prompt_agent_system_template",
        "single_prompt_agent_template",
    }
)
"""`RollDialect`'s fields that are hydra variables of ROLL's env library, read by no code."""


def strip_variables(data: dict[str, Any], referenced: set[str], fields) -> dict[str, Any]:
    """`data` without the top-level hydra variables that are not `fields` (the config's field
    names): keys the YAML interpolates (`${key...}`), ROLL's `<env>_format_penalty` numbers, and
    env libraries like `custom_env` under other names (ROLL's `gem_games`: a mapping of tags to
    env definitions, each with an `env_type`, from which `custom_envs` may copy)."""
    return {
        key: value
        for key, value in data.items()
        if key in fields
        or not (
            key in referenced
            or _is_env_library(value)
            or (_FORMAT_PENALTY_VARIABLE.fullmatch(key) and isinstance(value, (int, float)))
        )
    }


def _is_env_library(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and bool(value)
        and all(isinstance(env, dict) and "env_type" in env for env in value.values())
    )


def map_role_strategies(data: dict[str, Any]) -> None:
    """ROLL runs forward-only roles (reference, critic scoring) with `*_infer` engines: `hf_infer`
    is plain transformers on torch, `megatron_infer`/`deepspeed_infer` the training engine without
    an optimiser. Our forward-only roles run on the training engines, so those names become
    torch / megatron / deepspeed there (`actor_infer` keeps them, and is checked as usual).
    Megatron's `max_grad_norm` option is ROLL's way to pass the clip: it becomes the role's
    `training_args.max_grad_norm`."""
    forward_only = {
        "hf_infer": "torch",
        "megatron_infer": "megatron",
        "deepspeed_infer": "deepspeed",
        "fsdp2_infer": "fsdp2",
    }
    for role in ("actor_train", "reference", "critic"):
        worker = data.get(role)
        strategy = worker.get("strategy_args") if isinstance(worker, dict) else None
        if not isinstance(worker, dict) or not isinstance(strategy, dict):
            continue
        name = strategy.get("strategy_name")
        if role == "reference" and name in forward_only:
            strategy["strategy_name"] = forward_only[name]
        options = strategy.get("strategy_config")
        if isinstance(options, dict) and "max_grad_norm" in options:
            clip = options.pop("max_grad_norm")
            training = worker.setdefault("training_args", {})
            if isinstance(training, dict):
                training.setdefault("max_grad_norm", clip)


def check_dialect(cfg) -> None:
    """The dialect's checks and fills on a validated `PipelineConfig` (its model validator)."""
    for role, worker in cfg.workers.items():
        _check_worker_cls(role, worker.worker_cls)
        if cfg.max_grad_norm is not None and "max_grad_norm" not in worker.training_args.model_fields_set:
            worker.training_args.max_grad_norm = cfg.max_grad_norm
    for tag, env in cfg.custom_envs.items():
        known = (*ENV_MANAGER_CLASSES, *sorted(PROXY_ENV_MANAGERS))
        if env.env_manager_cls is not None and env.env_manager_cls not in known:
            raise InvalidField(
                f"custom_envs.{tag}.env_manager_cls",
                f"unknown class path {env.env_manager_cls!r}; known: {', '.join(known)}",
            )
        _check_runner(tag, env)
        for key in ("pre_step_template", "next_step_template"):
            if getattr(env, key) is not None and env.env_manager_cls not in VL_ENV_MANAGERS:
                raise InvalidField(
                    f"custom_envs.{tag}.{key}",
                    "is a template of the VL env manager; set env_manager_cls to "
                    "roll.pipeline.agentic.env_manager.vl_traj_env_manager.VLTrajEnvManager (or drop the key)",
                )
    for name, manager in cfg.env_managers.items():
        _manager_type_from_tags(name, manager, cfg.custom_envs)
    if cfg.num_gpus_per_node is not None and cfg.ray_address is None:
        for role, worker in cfg.workers.items():
            too_high = [d for d in worker.device_mapping or [] if d >= cfg.num_gpus_per_node]
            if too_high:
                raise InvalidField(
                    f"{role}.device_mapping",
                    f"GPU {too_high[0]} is not on a node of "
                    f"num_gpus_per_node={cfg.num_gpus_per_node} (a local run is one node)",
                )
    check_tracker(cfg)
    _check_algorithm_keys(cfg)
    if (
        cfg.train_infer_correction is not None
        and cfg.train_infer_correction.loss_options() is not None
        and cfg.off_policy_correction is not None
    ):
        raise InvalidField(
            "train_infer_correction",
            "and off_policy_correction both weight the loss by the trainer/engine ratio; keep one of them",
        )


def _check_runner(tag: str, env) -> None:
    """An agent runner and the proxy manager come together (roll.agentic.proxy)."""
    proxied = env.env_manager_cls in PROXY_ENV_MANAGERS
    if env.agent_runner_cls is None and proxied:
        raise InvalidField(f"custom_envs.{tag}.agent_runner_cls", "ProxyEnvManager needs an agent runner class")
    if env.agent_runner_cls is None:
        return
    if not proxied:
        raise InvalidField(
            f"custom_envs.{tag}.agent_runner_cls",
            "ROLL's agent runner plays through the chat proxy: set env_manager_cls to "
            "roll.pipeline.agentic.env_manager.proxy_env_manager.ProxyEnvManager (or null the runner)",
        )
    if not _RUNNER_PATH.fullmatch(env.agent_runner_cls):
        raise InvalidField(
            f"custom_envs.{tag}.agent_runner_cls",
            f"{env.agent_runner_cls!r} is not a class path (package.module.Class or package.module:Class)",
        )
    if env.response_prefix:
        raise InvalidField(
            f"custom_envs.{tag}.response_prefix", "a runner writes its own prompts through the proxy; leave it empty"
        )


def _check_worker_cls(role: str, path: str | None) -> None:
    if path is None:
        return
    roles = WORKER_CLASSES.get(path)
    if roles is None:
        raise InvalidField(f"{role}.worker_cls", f"unknown class path {path!r}; known: {', '.join(WORKER_CLASSES)}")
    if role not in roles:
        raise InvalidField(f"{role}.worker_cls", f"{path!r} is a worker of {' / '.join(roles)}, not of {role}")


def _manager_type_from_tags(name: str, manager, custom_envs) -> None:
    """A manager's type follows its tags' `env_manager_cls` (ROLL picks the class per tag) unless
    `env_manager_type` is set; one manager runs one type."""
    types = {
        tag: ENV_MANAGER_CLASSES[custom_envs[tag].env_manager_cls]
        for tag in manager.tags
        if tag in custom_envs and ENV_MANAGER_CLASSES.get(custom_envs[tag].env_manager_cls) is not None
    }  # proxy tags and ROLL's VLTrajEnvManager follow the manager's type
    if not types:
        return
    if len(set(types.values())) > 1:
        raise InvalidField(f"{name}.tags", f"mix env manager classes {types}; one manager runs one type")
    kind = next(iter(types.values()))
    if "env_manager_type" in manager.model_fields_set and manager.env_manager_type != kind:
        raise InvalidField(
            f"{name}.env_manager_type", f"{manager.env_manager_type!r}, but the tags' env_manager_cls say {kind!r}"
        )
    manager.env_manager_type = kind


def old_logprobs_pass_needed(cfg) -> str | None:
    """Why the score phase must compute this run's old log-probs in a pass of its own, whatever
    `enable_old_logprobs_recompute` says; None when the actor can take them in its training call."""
    if cfg.uses_kl_penalty:
        return "the KL penalty in the rewards (init_kl_coef / target_kl) needs them before the advantages"
    if cfg.actor_train is not None and cfg.actor_train.strategy_args.strategy_name == "megatron":
        return "the megatron strategy does not take them in its training step yet"
    return None


def old_logprobs_in_train(cfg) -> bool:
    """Whether the actor takes the old log-probs in its training call, so that the score phase
    runs no actor pass (`enable_old_logprobs_recompute`)."""
    if cfg.actor_train is None or old_logprobs_pass_needed(cfg):
        return False
    return cfg.force_disable_old_logprobs_recompute or not cfg.enable_old_logprobs_recompute


def _check_algorithm_keys(cfg) -> None:
    step_wise = cfg.train_env_manager.env_manager_type == "step"
    if cfg.force_disable_old_logprobs_recompute and (why := old_logprobs_pass_needed(cfg)):
        raise InvalidField(
            "force_disable_old_logprobs_recompute", f"{why}, so the old log-probs get a pass of their own"
        )
    if cfg.whiten_rewards and step_wise:
        raise InvalidField(
            "whiten_rewards", "whitens token rewards of trajectory-wise samples; step-wise ones have none"
        )
    variant = cfg.actor_train.pg_variant if cfg.actor_train is not None else None
    if cfg.dual_clip_loss and variant not in (None, "ppo"):
        raise InvalidField("dual_clip_loss", f"is a bound of the PPO loss; pg_variant {variant!r} has its own")
