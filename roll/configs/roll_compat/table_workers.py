"""Every field of ROLL's worker-level config dataclasses with roll's answer (`roll.configs.roll_compat.table`).

WorkerConfig (the roles actor_train, actor_infer, critic, reference) and its sections:
ModelArguments / LoraArguments (`model_args`), TrainingArguments (`training_args`),
GeneratingArguments (`generating_args`), DataArguments (`data_args`), StrategyArguments
(`strategy_args`), SequencePackingConfig (`sequence_packing_args`), RouterReplayConfig
(`router_replay`); EnvManagerConfig (train_env_manager, val_env_manager) and its LLMProxyConfig
(`llm_proxy`). An env manager inherits every WorkerConfig field in ROLL, where most configure a
model that an env worker does not have: "EnvManagerConfig.WorkerConfig" answers those.
"""

from __future__ import annotations

from roll.configs.roll_compat.answers import Answer, noop, ok, refused

_DATA = "a key of ROLL's prompt data sets (RLVR, SFT); the agentic pipeline's prompts come from its envs"
_DENSE = "roll's models are dense: they have no mixture-of-experts router"
_NOT_A_MODEL = (
    "an env manager is a CPU env worker: ROLL's EnvManagerConfig inherits this WorkerConfig field, which "
    "configures a model role, and its env workers run no model"
)

WORKER_CONFIG: dict[str, Answer] = {
    "name": noop("ROLL overwrites it with the role's own name"),
    "worker_cls": ok("ROLL's and roll's class paths of the role map to roll's worker"),
    "pg_variant": ok("the policy-gradient loss (ppo, tis, topr, cispo, kimi15)"),
    "model_args": ok("which model", section=("ModelArguments", "LoraArguments")),
    "training_args": ok("how to train it", section=("TrainingArguments",)),
    "data_args": ok("the chat template", section=("DataArguments",)),
    "generating_args": ok("sampling", section=("GeneratingArguments",)),
    "strategy_args": ok("the engine", section=("StrategyArguments",)),
    "world_size": ok("processes of the role"),
    "device_mapping": ok("the role's GPUs"),
    "num_gpus_per_worker": noop(
        "ROLL derives it (1 for training engines, tp x pp for vLLM); roll gives each process of a role the "
        "devices its engine needs"
    ),
    "model_update_frequency": refused("ROLL's weight sync every N steps; roll syncs after every step", off=(None, 1)),
    "infer_batch_size": ok("rows per forward-only call"),
    "backend_timeout": noop("the torch.distributed init timeout of ROLL's hf strategy; roll's rank groups set theirs"),
    "system_envs": ok("environment variables of the role's processes"),
    "topr_positive_weight": ok("TOPR weight of positive samples"),
    "topr_negative_weight": ok("TOPR weight of negative samples"),
    "max_concurrency": noop("concurrency of ROLL's Ray actor, raised by ROLL itself; roll sets its actors'"),
    "use_dynamic_batching_in_train": ok("token-budget micro-batches in training"),
    "max_tokens_per_microbatch_in_train": ok("the token budget in training"),
    "sequence_length_round_in_train": ok("micro-batch lengths rounded up to a multiple of this"),
    "use_dynamic_batching_in_infer": ok("token-budget micro-batches in log-prob passes"),
    "max_tokens_per_microbatch_in_infer": ok("the token budget in log-prob passes"),
    "sequence_length_round_in_infer": ok("micro-batch lengths rounded up to a multiple of this"),
    "offload_nccl": noop("ROLL forces it false"),
    "use_sequence_packing": ok(
        "micro-batches run as packed rows without padding, attention and positions per row (training roles "
        "and the reference on torch, fsdp2, deepspeed and megatron; megatron runs them in its thd format)"
    ),
    "sequence_packing_args": ok("the plan of packed micro-batches", section=("SequencePackingConfig",)),
    "logits_in_fp32": noop("roll always scores log-probs and entropies in at least float32"),
    "router_replay": noop("see RouterReplayConfig", section=("RouterReplayConfig",)),
    "apply_loss_scale": refused(
        "false would average gradients over micro-batches and ranks; roll always scales micro-batch losses "
        "so that gradients are those of the whole mini-batch, which is ROLL's true",
        off=(True,),
    ),
    "mtp_training_mode": refused(
        "multi-token-prediction heads (Megatron); roll's models have none", off=(None, "disabled")
    ),
    "opd_kl_coef": refused("a teacher's KL weight in on-policy distillation; roll has no teacher role", off=(None,)),
    "tag_included": refused("a teacher's tags in on-policy distillation; roll has no teacher role", off=(None, [])),
}

ENV_MANAGER_AS_WORKER: dict[str, Answer] = {
    **{name: noop(_NOT_A_MODEL) for name in WORKER_CONFIG},
    "name": noop("ROLL overwrites it (train_env, val_env)"),
    "model_args": noop("ROLL sets its model_name_or_path to pretrain, whose tokenizer roll's env managers use too"),
    "generating_args": ok(
        "the manager's sampling keys over actor_infer.generating_args", section=("GeneratingArguments",)
    ),
    "system_envs": ok("environment variables of the env workers"),
    "worker_cls": refused(
        "ROLL's env worker class; roll's env workers are its own",
        off=(None, "roll.pipeline.agentic.environment_worker.EnvironmentWorker"),
    ),
}

LLM_PROXY_CONFIG: dict[str, Answer] = {
    "proxy_type": refused(
        "ROLL's env managers may ask an OpenAI endpoint or a random policy instead of the trained one; "
        "roll's ask the trained policy (ROLL's policy)",
        off=(None, "policy"),
    ),
    "proxy_config": noop("options of the proxy type; the policy proxy reads none"),
}

ENV_MANAGER_CONFIG: dict[str, Answer] = {
    "llm_proxy": noop("which model the env managers ask: see LLMProxyConfig", section=("LLMProxyConfig",)),
    "num_env_groups": ok("env groups"),
    "group_size": ok("envs per group (same seed)"),
    "group_size_redundancy": ok("extra envs per group"),
    "tags": ok("env tags"),
    "num_groups_partition": ok("groups per tag"),
    "max_traj_per_env": noop(
        "ROLL's cap of episodes per env in a step, which it asserts is at least what a step needs; roll's "
        "scheduler starts as many episodes as a step needs"
    ),
    "format_penalty": ok("format penalty of the manager's envs"),
    "worker_cls": ENV_MANAGER_AS_WORKER["worker_cls"],
    "max_env_num_per_worker": ok("envs per env-worker process"),
    "group_filter_cls": refused(
        "ROLL's pluggable group filter; roll filters groups by rollout_filter_ratio (StarPO-S)",
        off=(None, "roll.pipeline.agentic.agentic_pipeline.GroupFilter"),
    ),
}

LORA_ARGUMENTS: dict[str, Answer] = {
    "additional_target": refused(
        "modules trained in full beside LoRA (PEFT modules_to_save) are not built", off=(None,)
    ),
    "autocast_adapter_dtype": refused("roll keeps PEFT's default, true", off=(None, True)),
    "lora_alpha": ok("LoRA scale"),
    "lora_dropout": refused("LoRA dropout is not built (roll's adapters have none)", off=(None, 0, 0.0)),
    "lora_rank": ok("LoRA rank (null: full fine-tuning)"),
    "lora_target": ok("modules that get adapters"),
}

MODEL_ARGUMENTS: dict[str, Answer] = {
    "model_name_or_path": ok("local HF model dir of the role"),
    "adapter_name_or_path": refused("loading a trained LoRA adapter is not built", off=(None,)),
    "attn_implementation": ok("attention kernel"),
    "moe_aux_loss_coef": refused("the MoE router's auxiliary loss; " + _DENSE, off=(None, 0, 0.0)),
    "disable_gradient_checkpointing": ok("gradient checkpointing off"),
    "gradient_checkpointing_use_reentrant": noop("both kinds of checkpointing compute the same gradients"),
    "device_map": noop("transformers' placement of one process's model; roll puts each process's model on its device"),
    "dtype": ok("fp32, bf16, fp16"),
    "model_type": ok('only the causal LM ("causal_lm"); ROLL\'s reward-model types are refused'),
    "num_labels": noop("head size of ROLL's reward/value models; roll's critic has one value head"),
    "model_config_kwargs": refused("overrides of the HF model config are not built", off=(None, {})),
    "freeze_module_prefix": refused("partial fine-tuning by module prefix is not built; use LoRA", off=(None,)),
    "ulysses_size": ok("Ulysses sequence parallelism (1 only)"),
}

TRAINING_ARGUMENTS: dict[str, Answer] = {
    "output_dir": noop("ROLL overwrites it with the run's output_dir"),
    "max_steps": noop("ROLL derives it from the run's max_steps"),
    "num_train_epochs": noop(_DATA),
    "learning_rate": ok("AdamW learning rate"),
    "lr_scheduler_type": ok("constant, linear or cosine"),
    "weight_decay": ok("AdamW weight decay"),
    "adam_beta1": ok("AdamW beta1"),
    "adam_beta2": ok("AdamW beta2"),
    "per_device_train_batch_size": ok("rows per micro-batch"),
    "gradient_accumulation_steps": ok("micro-batches per optimizer step"),
    "seed": noop("ROLL overwrites it with the run's seed"),
    "data_seed": noop(_DATA),
    "dataloader_num_workers": noop(_DATA),
    "fp16": noop("ROLL sets it from model_args.dtype, which roll reads"),
    "bf16": noop("ROLL sets it from model_args.dtype, which roll reads"),
    "tf32": refused("roll leaves torch's float32 matmul precision as it is", off=(None,)),
    "warmup_ratio": ok("warm-up fraction of the steps"),
    "warmup_steps": ok("warm-up steps"),
    "save_hf_model": noop("roll's checkpoints are always HF model dirs"),
}

GENERATING_ARGUMENTS: dict[str, Answer] = {
    "do_sample": ok("sample (else greedy)"),
    "temperature": ok("sampling temperature"),
    "top_p": ok("nucleus sampling"),
    "top_k": ok("top-k sampling"),
    "num_beams": ok("1 only"),
    "max_length": noop("ROLL uses it only when max_new_tokens is not positive, which roll refuses"),
    "max_new_tokens": ok("tokens per turn"),
    "repetition_penalty": refused("a repetition penalty is not built in roll's samplers", off=(None, 1, 1.0)),
    "length_penalty": noop("beam search only, and num_beams is 1"),
    "num_return_sequences": ok("1 only (ROLL's agentic config forces 1)"),
    "stop_strings": ok("stop strings"),
    "include_stop_str_in_output": refused("roll's engines do not make this choice configurable", off=(None,)),
    "logprobs": noop("roll's engines always return the sampled token's log-prob, which is what training reads"),
}

DATA_ARGUMENTS: dict[str, Answer] = {
    name: noop(_DATA)
    for name in (
        "domain_interleave_probs", "preprocessing_num_workers", "file_name", "eval_file_name", "dataset_type",
        "tag", "id", "prompt", "response", "messages", "image_max_pixels", "image_min_pixels", "video_max_pixels",
        "video_min_pixels", "video_total_pixels", "video_fps", "video_max_frames", "video_resize_chunk_frames",
        "image_folder", "video_folder", "audio_folder", "custom_data_kwargs_func",
    )
}  # fmt: skip
DATA_ARGUMENTS = {"template": ok("the chat template of the prompts"), **DATA_ARGUMENTS}

STRATEGY_ARGUMENTS: dict[str, Answer] = {
    "strategy_name": ok("ROLL's engine names, mapped to roll's engines"),
    "strategy_config": ok("the engine's options"),
}

SEQUENCE_PACKING_CONFIG: dict[str, Answer] = {
    "algorithm": ok('"none" (the usual micro-batches, packed) or "load_balance" (balanced workloads, as ROLL)'),
    "max_packed_sequence_length_forward": ok("load_balance: target tokens of a packed forward micro-batch"),
    "max_packed_sequence_length_train": ok("load_balance: target tokens of a packed training micro-batch"),
    "min_num_micro_batches_forward": ok("load_balance: at least this many forward micro-batches"),
    "min_num_micro_batches_train": ok("load_balance: at least this many training micro-batches"),
}

ROUTER_REPLAY_CONFIG: dict[str, Answer] = {
    "mode": refused("MoE router replay (Megatron / SGLang); " + _DENSE, off=(None, "disable")),
}

WORKER_TABLES: dict[str, dict[str, Answer]] = {
    "WorkerConfig": WORKER_CONFIG,
    "EnvManagerConfig": ENV_MANAGER_CONFIG,
    "EnvManagerConfig.WorkerConfig": ENV_MANAGER_AS_WORKER,
    "LLMProxyConfig": LLM_PROXY_CONFIG,
    "ModelArguments": MODEL_ARGUMENTS,
    "LoraArguments": LORA_ARGUMENTS,
    "TrainingArguments": TRAINING_ARGUMENTS,
    "GeneratingArguments": GENERATING_ARGUMENTS,
    "DataArguments": DATA_ARGUMENTS,
    "StrategyArguments": STRATEGY_ARGUMENTS,
    "SequencePackingConfig": SEQUENCE_PACKING_CONFIG,
    "RouterReplayConfig": ROUTER_REPLAY_CONFIG,
}
