"""Every field of ROLL's config dataclasses, run level, with roll's answer (`roll.configs.roll_compat.answers`).

ROLL's classes at commit `ROLL_COMMIT` (the one `../shared/roll_examples` and this dialect
follow): `roll/configs/{base_config,worker_config,model_args,training_args,generating_args,
data_args}.py` and `roll/pipeline/agentic/agentic_config.py`. `ROLL_TABLE[cls][field]` is the
answer; a class's table lists its own fields, inherited ones stay with the class that declares
them (`CLASS_BASES`). This module holds the run-level classes; the worker-level ones are in
`roll.configs.roll_compat.table_workers`. `roll.configs.roll_compat.keys` applies the table to a composed
config; `scripts/coming_from_roll.py` writes docs/coming_from_roll.md from it;
`tests/configs/test_roll_table.py` checks it against ROLL's source and walks every entry.
"""

from __future__ import annotations

from roll.configs.roll_compat.answers import Answer, noop, ok, refused
from roll.configs.roll_compat.table_workers import WORKER_TABLES

ROLL_COMMIT = "8eb27cc2"
"""alibaba/ROLL commit whose dataclasses the table answers."""

_RLVR = "read only by ROLL's RLVR (prompt data set) pipeline, never by its agentic one"
_UNREAD = "declared by ROLL but read by none of its code"
_OPD = "ROLL's on-policy distillation (a teacher model's KL as reward); roll has no teacher role"
_PROFILER_DIR = "a directory of ROLL's profiler and report outputs, which roll does not write"

SCHEDULE_CONFIG: dict[str, Answer] = {
    "generate_opt_level": noop(
        "ROLL's choice between one batched generate (0) and its request scheduler (1); roll's env "
        "managers always send requests one by one to a dynamically batching engine, which is level 1"
    ),
    "is_num_return_sequences_expand": noop(_RLVR + " (its agentic config forces one return sequence)"),
    "max_running_requests": noop(
        "ROLL's cap on requests in flight per vLLM/SGLang engine, a throughput knob; roll's hf engine "
        "is capped by strategy_config.max_batch_size, vllm/sglang by their own options (max_num_seqs)"
    ),
    "is_use_additional_prompts": noop(_RLVR),
    "max_additional_running_prompts": noop(_RLVR),
    "user_defined_rollout_loop_cls": refused(
        "ROLL's user-defined RLVR rollout loop; roll's rollout is its env managers",
        off=(None, "roll.distributed.scheduler.user_defined_rollout_loop.UserDefinedRolloutLoop"),
    ),
    "router_args": noop("routing of requests to engine replicas: see RouterArguments", section=("RouterArguments",)),
}

ROUTER_ARGUMENTS: dict[str, Answer] = {
    "router_name": refused(
        "roll's gateway keeps an episode's turns on one engine replica (sticky sessions) and sends "
        "new episodes to the least-loaded one, which is ROLL's EnvAffinityRouter; no other router is built",
        off=(None, "EnvAffinityRouter"),
    ),
    "router_config": noop("options of ROLL's router classes; roll's gateway has none"),
    "max_running_requests": noop("as the run-level max_running_requests, a throughput knob"),
}

TRANSFER_BACKEND_ARGUMENTS: dict[str, Answer] = {
    "backend_name": refused(
        "ROLL's pluggable weight-transfer backend; roll moves weights with its own model_update", off=(None,)
    ),
    "backend_config": noop("options of a transfer backend, which roll does not have"),
}

ROLLOUT_MOCK_CONFIG: dict[str, Answer] = {
    "enable": ok("record or replay each step's rollout (roll.configs.rollout.RolloutMock)"),
    "mode": ok('"dump" records, "mock" replays'),
    "dump_dir": ok("where the recordings are"),
}

BASE_CONFIG: dict[str, Answer] = {
    "exp_name": ok("the experiment's name, for paths in the YAML"),
    "seed": ok("root of every random choice of the run"),
    "rpc_timeout": ok("seconds the driver waits for one call on a worker"),
    "output_dir": ok("metrics.jsonl and checkpoints/step_N go here"),
    "base_dir": noop("a staging directory of ROLL's fsdp2 strategy; roll writes under output_dir"),
    "logging_dir": ok("TensorBoard events go here"),
    "rollout_dump_dir": ok("each step's trajectories as JSON lines"),
    "track_with": ok(
        "tensorboard, wandb (offline by default), mlflow (a SQLite file by default), swanlab (offline by "
        "default), trackio (a local SQLite file unless tracker_kwargs.space_id names a Space) or stdout"
    ),
    "tracker_kwargs": ok("arguments of the track_with backend; a key it does not take is refused by name"),
    "max_steps": ok("training steps of the run"),
    "save_steps": ok("a checkpoint every save_steps steps and at the last"),
    "max_ckpt_to_keep": ok("keep the newest N complete checkpoints (0: all); the one a resume reads is never deleted"),
    "logging_steps": ok("log metrics every logging_steps steps"),
    "eval_steps": ok("validate every eval_steps steps"),
    "rollout_batch_size": ok("trajectories per training step"),
    "max_running_requests": noop("as ScheduleConfig.max_running_requests"),
    "val_batch_size": ok("trajectories per validation"),
    "local_rank": noop("set by torch launchers in ROLL; roll's ranks come from its worker groups"),
    "resume_from_checkpoint": ok("false, true (the latest complete checkpoint) or a checkpoint dir"),
    "checkpoint_config": ok("where checkpoints are written (type file_system)"),
    "prompt_length": noop(
        "ROLL pads prompts to it and derives sequence_length from it with response_length (roll does the "
        "same sum); roll pads each batch to its longest row"
    ),
    "response_length": ok(
        "without sequence_length: sequence_length = prompt_length (default 1024) + response_length, as ROLL"
    ),
    "sequence_length": ok("most tokens of one trajectory"),
    "val_prompt_length": noop("as prompt_length, for validation prompts"),
    "val_sequence_length": refused(
        "a separate token bound for validation trajectories; roll bounds them by sequence_length too", off=(None,)
    ),
    "profiler_timeline": refused(
        "ROLL's torch-profiler timeline; roll's timings are the time/*_s metrics", off=(False,)
    ),
    "profiler_memory": refused("ROLL's CUDA memory snapshots; roll has no such profiler", off=(False,)),
    "report_length_and_rewards": noop("ROLL's report file of lengths and rewards; roll's metrics.jsonl has them"),
    "is_offload_states": noop(
        "ROLL's switch to move model states off the GPU between phases; roll's colocated roles take "
        "turns on the GPU by themselves (roll.pipeline.phases.gpu_offload); the numbers do not change"
    ),
    "is_offload_optimizer_states_in_train_step": noop(
        "a memory saving of ROLL's megatron strategy inside a train step; the numbers do not change"
    ),
    "length_profiler_dir": noop(_PROFILER_DIR),
    "profiler_output_dir": noop(_PROFILER_DIR),
    "otlp_output_dir": noop(_PROFILER_DIR + " (OpenTelemetry traces)"),
    "system_envs": ok("environment variables of the driver and every worker"),
    "model_update_buffer_size_mb": noop("bucket size of ROLL's weight broadcast; roll's model_update sizes its own"),
    "num_nodes": noop("ROLL derives it from the device mappings, overwriting any value given"),
    "num_gpus_per_node": ok("GPUs of one node, for device_mapping indices"),
    "model_download_type": noop(
        "the hub ROLL downloads models from; roll loads local model dirs only, never downloads"
    ),
    "rollout_mock": ok("rollout dump/mock", section=("RolloutMockConfig",)),
    "transfer_backend": noop("see TransferBackendArguments", section=("TransferBackendArguments",)),
}

TRAIN_INFER_IS_WEIGHT_CONFIG: dict[str, Answer] = {
    "enabled": ok("weight the loss by the trainer/engine probability ratio"),
    "weight_type": ok("token, segment, geometric or sequence"),
    "upper_bound": ok("clamp of the weight"),
    "detach": ok("no gradient through the weight"),
}
TRAIN_INFER_FILTER_CONFIG: dict[str, Answer] = {
    name: ok("a token filter on the trainer/engine log-prob gap (roll.algorithms.train_infer)")
    for name in (
        "enabled",
        "agg_type",
        "ratio_enabled",
        "ratio_low",
        "ratio_high",
        "diff_enabled",
        "diff_low",
        "diff_high",
    )
}
TRAIN_INFER_CORRECTION_CONFIG: dict[str, Answer] = {
    "is_weight": ok("importance weights", section=("TrainInferISWeightConfig",)),
    "filters": ok("token filters, applied in order", section=("TrainInferFilterConfig",)),
}

PPO_CONFIG: dict[str, Answer] = {
    "pretrain": ok("local HF model dir of every role"),
    "reward_pretrain": ok("local HF model dir of the critic"),
    "actor_train": ok("the trained policy", section=("WorkerConfig",)),
    "actor_infer": ok("the policy's inference engine", section=("WorkerConfig",)),
    "critic": ok("the value model (adv_estimator gae)", section=("WorkerConfig",)),
    "reference": ok("the frozen policy of the KL terms", section=("WorkerConfig",)),
    "reward": refused("ROLL's reward-model worker (an LLM judge); roll's rewards come from the envs"),
    "async_generation_ratio": ok("how many steps rollout runs ahead of training"),
    "ppo_epochs": ok("passes over each rollout batch"),
    "max_grad_norm": ok("gradient clip of every trained role that sets none"),
    "l2": noop(_UNREAD),
    "lambd": ok("GAE lambda"),
    "gamma": ok("discount"),
    "pg_clip": ok("PPO clip range"),
    "use_pg_clip_range": ok(
        "true: pg_clip_low / pg_clip_high clip the ratio; false: pg_clip does and the two are ignored, "
        "as ROLL (left out, roll uses pg_clip_low / pg_clip_high when they are given)"
    ),
    "pg_clip_low": ok("lower clip range"),
    "pg_clip_high": ok("upper clip range"),
    "value_clip": ok("clip of the value loss"),
    "kl_penalty": ok('KL estimator of the reward penalty; ROLL\'s "full" is refused'),
    "target_kl": ok("adaptive KL target"),
    "init_kl_coef": ok("(initial) weight of the KL penalty in the rewards"),
    "kl_horizon": ok("horizon of the adaptive KL controller"),
    "use_reward_scaling": noop(_UNREAD),
    "add_len_reward": noop(_UNREAD),
    "reward_clip": ok("clamp of the rewards"),
    "use_reward_norm": noop(_UNREAD),
    "whiten_rewards": ok("whiten the token rewards over the batch's response tokens before the estimator, as ROLL"),
    "whiten_advantages": ok("whiten advantages over the batch"),
    "advantage_clip": ok("clamp of the advantages"),
    "adv_estimator": ok('gae, reinforce, grpo, gigpo, step_reinforce; ROLL\'s "agentic_reinforce" is refused'),
    "norm_mean_type": noop(_RLVR + "; the agentic pipeline normalises with reward_normalization"),
    "norm_std_type": noop(_RLVR + "; the agentic pipeline normalises with reward_normalization"),
    "add_token_level_kl": ok(
        "true: the KL penalty (init_kl_coef) is subtracted from the token rewards; false: the KL is only "
        "measured, as ROLL (left out: roll's own rule, the penalty is on whenever init_kl_coef > 0)"
    ),
    "critic_warmup": ok("the first critic_warmup steps train the critic only, as ROLL"),
    "use_kl_loss": ok("KL term in the actor loss"),
    "kl_loss_coef": ok("weight of the KL loss"),
    "entropy_loss_coef": ok("weight of the entropy bonus"),
    "loss_agg_mode": ok('token-mean, seq-mean-token-mean, seq-mean-token-sum; "seq-mean-token-sum-norm" is refused'),
    "dual_clip_loss": ok("dual-clip PPO for negative advantages, with ROLL's bound 1 + 2 * pg_clip"),
    "enable_reference": noop(
        "ROLL switches it on itself when a KL term needs the reference (else it only adds a metric); roll "
        "runs the reference exactly when a KL term needs it"
    ),
    "enable_old_logprobs_recompute": ok(
        "false (the default) takes the old log-probs in the actor's training call, exact for any number of "
        "mini-batches and every estimator (ROLL runs the pass for several mini-batches, gigpo and step_reinforce)"
    ),
    "force_disable_old_logprobs_recompute": ok(
        "takes them in the training call whatever the key above says, still exact (ROLL's cache takes rows "
        "after the first mini-batch from updated weights); refused where a pass is needed"
    ),
    "train_infer_correction": ok("importance weights and token filters", section=("TrainInferCorrectionConfig",)),
    "pure_opd_pipeline_type": noop("read only by ROLL's distillation launcher"),
    "teacher": refused(_OPD),
    "student_train": refused(_OPD),
    "student_infer": refused(_OPD),
    "is_pure_opd": refused(_OPD),
    "use_opd": refused(_OPD),
}

REWARD_NORMALIZATION_CONFIG: dict[str, Answer] = {
    "grouping": ok("which rows share the statistics"),
    "method": ok("ROLL's older switch, used when norm_mean_type / norm_std_type are left out"),
    "norm_mean_type": ok("subtract the batch or group mean"),
    "norm_std_type": ok("divide by the batch or group std"),
    "global_scale_factor": refused("ROLL's global affine transform of rewards is not built", off=(None,)),
    "global_shift_value": refused("ROLL's global affine transform of rewards is not built", off=(None,)),
}

ENV_MONITOR_CONFIG: dict[str, Answer] = {
    "enable": ok("whether a group past hung_timeout gets its env worker probed"),
    "hung_timeout": ok(
        "seconds a group may run before its env worker is probed; a stuck worker is restarted "
        "(ROLL only logs it); roll's default is 900"
    ),
    "monitor_interval": noop(
        "ROLL's polling period of its monitor; roll waits on each group's own deadline, so a hang "
        "is noticed at hung_timeout, not up to one interval later"
    ),
}

AGENTIC_CONFIG: dict[str, Answer] = {
    "custom_envs": ok("env kinds by tag"),
    "train_env_manager": ok("training envs", section=("EnvManagerConfig", "EnvManagerConfig.WorkerConfig")),
    "val_env_manager": ok("validation envs", section=("EnvManagerConfig", "EnvManagerConfig.WorkerConfig")),
    "render_save_dir": ok("text frames of validation episodes"),
    "reward": refused("ROLL's reward-model worker (an LLM judge); roll's rewards come from the envs"),
    "reward_normalization": ok("normalise episode scores", section=("RewardNormalizationConfig",)),
    "env_monitor": ok("the group deadline that finds a stuck env worker", section=("EnvMonitorConfig",)),
    "dirty_data_mask": noop(_UNREAD),
    "open_feedback_turn": noop(_UNREAD),
    "use_token_reward": noop(_UNREAD),
    "batch_adjust_mode": ok("rule for a batch that is not a whole number of mini-batches"),
    "episode_reward_weight": ok("GiGPO episode weight"),
    "step_reward_weight": ok("GiGPO step weight"),
    "step_reward_gamma": ok("discount of step rewards"),
    "ratio_type": refused(
        "ROLL's segment ratio (one PPO ratio per contiguous response segment) is not built; roll's is per token",
        off=(None, "token"),
    ),
    "exp_mode": noop("read only by ROLL's ROCK terminal-bench env, which roll refuses"),
    "partial_gpu_mode": noop(
        "ROLL's shrinking of the engine onto fewer GPUs during training; roll's colocated roles take turns "
        "through residency; the numbers do not change"
    ),
    "parse_tool_call_parameter_to_dict": refused(
        "ROLL's fix-up of Qwen3-Coder tool-call arguments in its native env manager is not built"
    ),
    "skip_mock_system_prompt": refused(
        "ROLL's workaround for chat templates that add no system prompt (Qwen3.5) is not built"
    ),
}

REWARD_CONFIG: dict[str, Answer] = {
    "llm_proxy": refused("the proxy of ROLL's reward-model worker, which roll refuses (reward)"),
}

ROLL_TABLE: dict[str, dict[str, Answer]] = {
    "AgenticConfig": AGENTIC_CONFIG,
    "PPOConfig": PPO_CONFIG,
    "BaseConfig": BASE_CONFIG,
    "ScheduleConfig": SCHEDULE_CONFIG,
    "RouterArguments": ROUTER_ARGUMENTS,
    "TransferBackendArguments": TRANSFER_BACKEND_ARGUMENTS,
    "RolloutMockConfig": ROLLOUT_MOCK_CONFIG,
    "TrainInferCorrectionConfig": TRAIN_INFER_CORRECTION_CONFIG,
    "TrainInferISWeightConfig": TRAIN_INFER_IS_WEIGHT_CONFIG,
    "TrainInferFilterConfig": TRAIN_INFER_FILTER_CONFIG,
    "RewardNormalizationConfig": REWARD_NORMALIZATION_CONFIG,
    "EnvMonitorConfig": ENV_MONITOR_CONFIG,
    "RewardConfig": REWARD_CONFIG,
    **WORKER_TABLES,
}
"""ROLL class -> field -> answer. "EnvManagerConfig.WorkerConfig" is not a ROLL class: it answers
the fields an env manager inherits from WorkerConfig, which mean something else there."""

TOP_LEVEL = ("AgenticConfig", "PPOConfig", "BaseConfig", "ScheduleConfig")
"""The classes whose fields are the YAML's top-level keys (AgenticConfig and its bases)."""
CLASS_BASES = {"EnvManagerConfig": "WorkerConfig", "ModelArguments": "LoraArguments", "RewardConfig": "WorkerConfig"}
"""ROLL's inheritance among the classes of the table, other than the top-level chain."""
