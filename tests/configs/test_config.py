"""Config loading and validation: a valid YAML gives the exact values; every malformed config
gives one `ConfigError` line that names the offending key."""

from __future__ import annotations

import copy
import os
import shutil

import pytest

from roll.configs import ConfigError, GeneratingArgs, load_config, validate_config
from roll.configs.worker import STRATEGY_OPTIONS
from roll.core.records import SamplingParams
from roll.pipeline.checks.config import check_before_start

CONFIG_DIR = os.path.dirname(os.path.abspath(__file__))
CONFIG_NAME = "minimal_agentic"


def load(model_dir, *overrides):
    return load_config(CONFIG_DIR, CONFIG_NAME, [f"pretrain={model_dir}", *overrides])


def error_of(model_dir, *overrides) -> str:
    """The one-line error of the config, from validation or from the checks run before start."""
    with pytest.raises(ConfigError) as info:
        check_before_start(load(model_dir, *overrides))
    return str(info.value)


@pytest.mark.parametrize(("value", "mode"), [("true", "continue"), ("false", "finish"), ("abort", "abort")])
def test_partial_rollout_takes_a_bool_or_a_mode(model_dir, value, mode):
    assert load(model_dir, f"+partial_rollout={value}", "async_generation_ratio=1").partial_rollout == mode
    assert load(model_dir).partial_rollout == "finish"


def test_valid_yaml_gives_exact_values_and_derived_sizes(model_dir):
    cfg = load(model_dir)
    assert cfg.exp_name == "minimal" and cfg.max_steps == 3 and cfg.seed == 7
    assert cfg.val_batch_size == 8  # ${rollout_batch_size}
    assert cfg.actor_train.strategy_args.strategy_name == "torch"  # alias torch_train
    assert cfg.actor_infer.strategy_args.strategy_name == "hf"
    for worker in (cfg.actor_train, cfg.actor_infer):
        assert worker.model_args.model_name_or_path == model_dir
    assert cfg.train_groups_per_step == 2  # 8 trajectories / group_size 4
    assert cfg.val_groups_per_eval == 4  # 8 trajectories / group_size 2
    assert cfg.train_env_manager.groups_per_tag == {"SimpleFrozenLake": 2}
    assert cfg.val_env_manager.groups_per_tag == {"SimpleFrozenLake": 3, "LargeFrozenLake": 1}
    assert cfg.val_env_manager.num_envs == 8
    assert cfg.actor_train.training_args.mini_batch_size == 8  # 4 per micro-batch x 2
    assert not cfg.uses_kl
    assert cfg.custom_envs["LargeFrozenLake"].max_tokens_per_step == 64  # default


def test_manager_generating_args_override_only_the_keys_they_set(model_dir):
    cfg = load(model_dir)
    val = cfg.generating_args_for(cfg.val_env_manager)
    assert (val.do_sample, val.max_new_tokens, val.temperature) == (False, 8, 1.0)
    assert cfg.generating_args_for(cfg.train_env_manager) == cfg.actor_infer.generating_args


def test_to_sampling_params():
    args = GeneratingArgs(max_new_tokens=16, temperature=0.5, top_p=0.9, top_k=5, do_sample=True)
    assert args.to_sampling_params(stop_token_ids=[3, 7]) == SamplingParams(
        max_new_tokens=16, temperature=0.5, top_p=0.9, top_k=5, do_sample=True, stop_token_ids=[3, 7]
    )
    assert args.to_sampling_params(max_new_tokens=4).max_new_tokens == 4


def test_critic_and_reference_models_come_from_the_right_pretrain(model_dir, tmp_path):
    reward_dir = tmp_path / "reward"
    reward_dir.mkdir()
    (reward_dir / "config.json").write_text("")
    critic = ["+critic.strategy_args.strategy_name=torch", "adv_estimator=gae"]
    reference = ["+reference.strategy_args.strategy_name=torch", "init_kl_coef=0.1"]
    cfg = load(model_dir, *critic, *reference, f"reward_pretrain={reward_dir}")
    assert cfg.critic.model_args.model_name_or_path == str(reward_dir)
    assert cfg.reference.model_args.model_name_or_path == model_dir
    assert cfg.uses_kl
    assert load(model_dir, *critic).critic.model_args.model_name_or_path == model_dir


def test_plain_override_of_a_key_the_yaml_leaves_at_its_default(model_dir):
    # Neither key is in the YAML; hydra alone would demand "+adv_estimator=...".
    cfg = load(model_dir, "adv_estimator=reinforce", "custom_envs.SimpleFrozenLake.env_config.hole_prob=0.1")
    assert cfg.adv_estimator == "reinforce"
    assert cfg.custom_envs["SimpleFrozenLake"].env_config == {"size": 4, "hole_prob": 0.1}


def test_validate_config_accepts_a_plain_dict(model_dir):
    data = load(model_dir).model_dump()
    assert validate_config(copy.deepcopy(data)).model_dump() == data
    del data["actor_infer"]["strategy_args"]
    with pytest.raises(ConfigError) as info:
        validate_config(data)
    assert str(info.value) == "actor_infer.strategy_args: required key is missing"


def test_defaults_list_and_cwd_relative_config_path(model_dir, tmp_path, monkeypatch):
    shutil.copy(os.path.join(CONFIG_DIR, f"{CONFIG_NAME}.yaml"), tmp_path / "base.yaml")
    (tmp_path / "child.yaml").write_text("defaults:\n  - base\n  - _self_\nmax_steps: 9\n")
    monkeypatch.chdir(tmp_path.parent)
    cfg = load_config(tmp_path.name, "child", [f"pretrain={model_dir}"])
    assert (cfg.max_steps, cfg.exp_name) == (9, "minimal")


SUGGEST = "unknown key (did you mean {!r}?)"
MALFORMED = [
    (["+max_step=3"], "max_step: " + SUGGEST.format("max_steps")),
    (
        ["+actor_train.training_args.lerning_rate=0.1"],
        "actor_train.training_args.lerning_rate: " + SUGGEST.format("learning_rate"),
    ),
    (  # a key hydra itself rejects (no "+"): named the same way
        ["actor_train.training_args.lerning_rate=0.1"],
        "actor_train.training_args.lerning_rate: " + SUGGEST.format("learning_rate"),
    ),
    (
        ["+custom_envs.SimpleFrozenLake.max_step=3"],
        "custom_envs.SimpleFrozenLake.max_step: " + SUGGEST.format("max_steps"),
    ),
    (
        ["+train_env_manager.generating_args.temprature=0"],
        "train_env_manager.generating_args.temprature: " + SUGGEST.format("temperature"),
    ),
    (
        ["max_steps=abc"],
        "max_steps: input should be a valid integer, unable to parse string as an integer (got 'abc')",
    ),
    (  # val_batch_size is ${rollout_batch_size}: -8 too
        ["rollout_batch_size=-8"],
        "rollout_batch_size: input should be greater than or equal to 1 (got -8) (and 1 more error)",
    ),
    (
        ["train_env_manager.num_env_groups=0"],
        "train_env_manager.num_env_groups: input should be greater than or equal to 1 (got 0)",
    ),
    (
        ["actor_infer.generating_args.top_p=0"],
        "actor_infer.generating_args.top_p: input should be greater than 0 (got 0)",
    ),
    (
        ["+actor_train.model_args.dtype=fp8"],
        "actor_train.model_args.dtype: input should be 'float32', 'bfloat16' or 'float16' (got 'fp8')",
    ),
    (
        ["max_steps=abc", "rollout_batch_size=0"],
        "max_steps: input should be a valid integer, unable to parse string as an integer (got 'abc')"
        " (and 1 more error)",
    ),
    (["~max_steps"], "max_steps: required key is missing"),
    (
        ["train_env_manager.group_size=3"],
        "rollout_batch_size: 8 is not a multiple of train_env_manager.group_size=3",
    ),
    (["val_batch_size=7"], "val_batch_size: 7 is not a multiple of val_env_manager.group_size=2"),
    (
        ["val_env_manager.num_groups_partition=[3,2]"],
        "val_env_manager.num_groups_partition: [3, 2] must be non-negative and sum to num_env_groups=4",
    ),
    (
        ["val_env_manager.num_groups_partition=[4]"],
        "val_env_manager.num_groups_partition: needs one number per tag "
        "['SimpleFrozenLake', 'LargeFrozenLake'], got [4]",
    ),
    (
        ["~val_env_manager.num_groups_partition", "val_env_manager.num_env_groups=1"],
        "val_env_manager.num_env_groups: 1 cannot be divided among 2 tags "
        "['SimpleFrozenLake', 'LargeFrozenLake'] (each needs a group)",
    ),
    (
        ["train_env_manager.tags=[SimpleFrozenLake,SimpleFrozenLake]"],
        "train_env_manager.tags: must be distinct (got ['SimpleFrozenLake', 'SimpleFrozenLake'])",
    ),
    (
        ["train_env_manager.tags=[Nope]"],
        "train_env_manager.tags: 'Nope' is not in custom_envs ['LargeFrozenLake', 'SimpleFrozenLake']",
    ),
    (["adv_estimator=gae"], 'critic: required by adv_estimator "gae"'),
    (["init_kl_coef=0.1"], "reference: required when init_kl_coef > 0, target_kl is set or use_kl_loss is on"),
    (["target_kl=0.01"], "reference: required when init_kl_coef > 0, target_kl is set or use_kl_loss is on"),
    (
        ["async_generation_ratio=-1"],
        "async_generation_ratio: input should be greater than or equal to 0 (got -1)",
    ),
    (
        ["+val_env_manager.rescue_rounds=1"],
        "val_env_manager.rescue_rounds: validation plays a fixed set of episodes; rescue rounds are for "
        "train_env_manager",
    ),
    (
        ["+train_env_manager.rescue_rounds=-1"],
        "train_env_manager.rescue_rounds: input should be greater than or equal to 0 (got -1)",
    ),
    (
        ["+train_env_manager.rescue_temperature=1.5"],
        "train_env_manager.rescue_temperature: needs rescue_rounds > 0 (it is the rescue rounds' temperature)",
    ),
    (
        ["+train_env_manager.rescue_rounds=1", "+train_env_manager.rescue_temperature=0"],
        "train_env_manager.rescue_temperature: input should be greater than 0 (got 0)",
    ),
    (
        ["+async_max_staleness=0"],
        "async_max_staleness: limits async training; set async_generation_ratio > 0 too",
    ),
    (
        ["+partial_rollout=pause"],
        "partial_rollout: input should be 'finish', 'continue' or 'abort' (got 'pause')",
    ),
    (
        ["+partial_rollout=true"],
        "partial_rollout: 'continue' acts on generations running at a weight sync, and with "
        "async_generation_ratio 0 none is; set async_generation_ratio > 0 or leave it false",
    ),
    (
        ["+partial_rollout=true", "async_generation_ratio=1", "actor_infer.strategy_args.strategy_name=sglang"],
        "partial_rollout: 'continue' needs actor_infer on a continuous engine (hf or vllm); 'sglang' finishes "
        "each engine call before a weight sync (use false)",
    ),
    (
        [
            "+partial_rollout=abort",
            "async_generation_ratio=1",
            "+actor_infer.strategy_args.strategy_config={continuous_batching: false}",
        ],
        "partial_rollout: 'abort' needs actor_infer.strategy_args.strategy_config.continuous_batching: true",
    ),
    (
        [
            "actor_train.strategy_args.strategy_name=megatron_train",
            "+actor_train.strategy_args.strategy_config={tensor_parallel_size: 2}",
        ],
        "actor_train.strategy_args.strategy_config.tensor_parallel_size: not an option of strategy 'megatron' "
        "(options: tensor_model_parallel_size, pipeline_model_parallel_size, expert_model_parallel_size, "
        "context_parallel_size, sequence_parallel, use_distributed_optimizer, recompute_granularity, "
        "num_layers_in_first_pipeline_stage, num_layers_in_last_pipeline_stage, max_grad_norm, "
        "bias_activation_fusion, bias_dropout_fusion, apply_rope_fusion, masked_softmax_fusion, "
        "gradient_accumulation_fusion, persist_layer_norm)",
    ),
    (
        [
            "actor_train.strategy_args.strategy_name=megatron_train",
            "+actor_train.world_size=3",
            "+actor_train.strategy_args.strategy_config={tensor_model_parallel_size: 2}",
        ],
        "actor_train.strategy_args.strategy_config.tensor_model_parallel_size: world_size 3 is not divisible by "
        "tensor_model_parallel_size * pipeline_model_parallel_size = 2",
    ),
    (
        [
            "actor_train.strategy_args.strategy_name=megatron_train",
            "+actor_train.strategy_args.strategy_config={expert_model_parallel_size: 2}",
        ],
        "actor_train.strategy_args.strategy_config.expert_model_parallel_size: expert parallel needs a MoE "
        "model; only dense Llama/Qwen2 convert",
    ),
    (
        [
            "init_kl_coef=0.1",
            "+reference={strategy_args: {strategy_name: megatron_infer, "
            "strategy_config: {tensor_model_parallel_size: 2}}, world_size: 2}",
        ],
        "reference.strategy_args.strategy_config.tensor_model_parallel_size: the reference computes log-probs "
        "with the HF model on each rank; model parallelism is built for actor_train only",
    ),
    (
        ["+critic.strategy_args.strategy_name=megatron", "adv_estimator=gae"],
        "critic.strategy_args.strategy_name: 'megatron' trains causal LMs only; the critic's value model "
        "needs torch, deepspeed or fsdp2",
    ),
    (
        ["actor_infer.strategy_args.strategy_name=sglang"],
        "actor_infer.strategy_args.strategy_name: 'sglang' needs the sglang package and a CUDA GPU",
    ),
    (
        ["+actor_train.strategy_args.strategy_config={reshard_after_forward: true}"],
        "actor_train.strategy_args.strategy_config.reshard_after_forward: not an option of strategy "
        "'torch' (options: torch_compile)",
    ),
    (
        ["actor_train.strategy_args.strategy_name=fsdp2", "+actor_train.strategy_args.strategy_config={reshard: true}"],
        "actor_train.strategy_args.strategy_config.reshard: not an option of strategy 'fsdp2' "
        "(options: torch_compile, reshard_after_forward, fsdp_size, param_dtype, reduce_dtype, offload_policy)",
    ),
    (
        ["+actor_train.strategy_args.strategy_config={torch_compile: sometimes}"],
        "actor_train.strategy_args.strategy_config.torch_compile: expected true or false (got 'sometimes')",
    ),
    (
        [
            "init_kl_coef=0.1",
            "+reference={strategy_args: {strategy_name: torch, strategy_config: {torch_compile: true}}}",
        ],
        "reference.strategy_args.strategy_config.torch_compile: the reference computes its log-probs with the "
        "HF model, uncompiled; torch_compile applies to actor_train and critic",
    ),
    (
        [
            "actor_train.strategy_args.strategy_name=megatron",
            "+actor_train.strategy_args.strategy_config={torch_compile: true}",
        ],
        "actor_train.strategy_args.strategy_config.torch_compile: not an option of strategy 'megatron' (options: "
        + ", ".join(STRATEGY_OPTIONS["megatron"])
        + ")",
    ),
    (
        [
            "actor_train.strategy_args.strategy_name=fsdp2",
            "+actor_train.strategy_args.strategy_config={param_dtype: bf8}",
        ],
        "actor_train.strategy_args.strategy_config.param_dtype: 'bf8' is not a dtype; use bf16, fp16 or fp32",
    ),
    (
        [
            "actor_train.strategy_args.strategy_name=fsdp2",
            "+actor_train.world_size=6",
            "+actor_train.strategy_args.strategy_config={fsdp_size: 4}",
        ],
        "actor_train.strategy_args.strategy_config.fsdp_size: 4 does not divide the role's 6 ranks "
        "(HSDP shards within groups of fsdp_size and replicates across them)",
    ),
    (
        ["++actor_infer.strategy_args.strategy_config.batch_wait_ms=-1"],
        "actor_infer.strategy_args.strategy_config.batch_wait_ms: must be a number >= 0, got -1",
    ),
    (
        ["++actor_infer.strategy_args.strategy_config.continuous_batching=sometimes"],
        "actor_infer.strategy_args.strategy_config.continuous_batching: must be true or false",
    ),
    (
        ["++actor_infer.strategy_args.strategy_config.static_decode=maybe"],
        "actor_infer.strategy_args.strategy_config.static_decode: must be true, false or null (where supported)",
    ),
    (
        ["actor_train.strategy_args.strategy_name=hf"],
        "actor_train.strategy_args.strategy_name: 'hf' cannot run actor_train; "
        "available for actor_train: torch, deepspeed, fsdp2, megatron",
    ),
    (
        ["actor_infer.strategy_args.strategy_name=foo"],
        "actor_infer.strategy_args.strategy_name: 'foo' is not a known strategy; "
        "available for actor_infer: hf, vllm, sglang",
    ),
    (["~val_env_manager"], "val_env_manager: required when eval_steps > 0"),
    (["val_batch_size=0"], "val_batch_size: must be > 0 when eval_steps > 0"),
    (
        ["+actor_train.device_mapping=[0,0]"],
        "actor_train.device_mapping: device indices must be distinct (got [0, 0])",
    ),
    (
        ["+resume_from_checkpoint=/no/such/ckpt"],
        "resume_from_checkpoint: expected true, false or an existing checkpoint directory (got '/no/such/ckpt')",
    ),
    (["val_batch_size=${nope}"], "val_batch_size: Interpolation key 'nope' not found"),
    (["max_steps=[1"], "max_steps=[1: bad override syntax: no viable alternative at input '[1'"),
]


@pytest.mark.parametrize(("overrides", "expected"), MALFORMED, ids=[" ".join(o) for o, _ in MALFORMED])
def test_malformed_config_names_the_key(model_dir, overrides, expected):
    assert error_of(model_dir, *overrides) == expected


def test_model_dirs_must_hold_config_json(model_dir, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    why = (
        f"{str(empty)!r} is not a local model directory (no config.json); build the tiny model with "
        "`python -m roll.pipeline.tiny_model --output_dir DIR` and point to DIR"
    )
    assert error_of(str(empty)) == f"pretrain: {why}"
    assert error_of(model_dir, f"+reward_pretrain={empty}") == f"reward_pretrain: {why}"
    explicit = f"+actor_infer.model_args.model_name_or_path={empty}"
    assert error_of(model_dir, explicit) == f"actor_infer.model_args.model_name_or_path: {why}"


def test_unknown_env_type_names_the_env(model_dir):
    cfg = load(model_dir, "custom_envs.LargeFrozenLake.env_type=no_such_env")  # validation imports no env
    with pytest.raises(ConfigError) as info:
        check_before_start(cfg)  # the check before the run starts does
    message = str(info.value)
    assert message.startswith("custom_envs.LargeFrozenLake.env_type: unknown env_type 'no_such_env'")


def test_file_level_errors(model_dir, tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(CONFIG_DIR, CONFIG_NAME, [])
    assert str(info.value) == "pretrain: required value is missing (it is ??? in the YAML)"
    with pytest.raises(ConfigError) as info:
        load_config(CONFIG_DIR, "nope", [])
    assert str(info.value) == f"config_name: no 'nope' config in {CONFIG_DIR}"
    with pytest.raises(ConfigError) as info:
        load_config(str(tmp_path / "nodir"), CONFIG_NAME, [])
    assert str(info.value) == f"config_path: {str(tmp_path / 'nodir')!r} is not a directory"
    (tmp_path / "broken.yaml").write_text("max_steps: [1\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(tmp_path), "broken", [])
    assert str(info.value).startswith(f"{tmp_path / 'broken.yaml'} line 2: invalid YAML: ")
    (tmp_path / "with_group.yaml").write_text("defaults:\n  - preset: fast\n")
    (tmp_path / "preset").mkdir()
    (tmp_path / "preset" / "slow.yaml").write_text("max_steps: 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(tmp_path), "with_group", [])
    assert str(info.value) == "preset: cannot find config 'preset/fast'; options: ['slow']"


def test_slot_tags_spread_each_tag_over_the_slots():
    """Group j of a step plays slot j's tag: spread out, a step of fewer groups than slots still
    plays every tag in proportion (one LongLake in each ten of 2 + 18 slots)."""
    from roll.configs.env import EnvManagerConfig

    def slots(tags, partition):
        return EnvManagerConfig.model_construct(
            tags=tags, num_groups_partition=partition, num_env_groups=sum(partition)
        ).slot_tags

    long_tail = slots(["L", "S"], [2, 18])
    assert [i for i, t in enumerate(long_tail) if t == "L"] == [4, 14]
    assert slots(["A", "B"], [2, 2]) == ["A", "B", "A", "B"]
    assert slots(["A", "B", "C"], [3, 2, 2]) == ["A", "B", "C", "A", "B", "C", "A"]
    assert slots(["A", "B"], [3, 0]) == ["A", "A", "A"]
