"""Config keys of the strategy features (issue 18): LoRA, gradient checkpointing, dynamic batching,
dtype and attention spellings of ROLL; bad values exit 2 with one line naming the key."""

from __future__ import annotations

import importlib.util

import pytest

# no_pipeline: the autouse fixture that fails a test which gets past validation into the pipeline
from test_bad_configs import CONFIG_DIR, CONFIG_NAME, assert_one_line, no_pipeline, run_cli  # noqa: F401

from roll.configs import load_config
from roll.configs.worker import ModelArgs
from roll.pipeline.setup.builders import training_features
from tests.conftest import tiny_llama_config


@pytest.fixture
def llama_dir(tmp_path) -> str:
    """A model dir with a real Llama config.json (no weights: the LoRA check reads the config)."""
    tiny_llama_config(layers=1).save_pretrained(tmp_path / "llama")
    return str(tmp_path / "llama")


BAD = [
    (
        ["+actor_train.model_args.lora_rank=4", "+actor_train.model_args.lora_target='q_proj,qkv_proj'"],
        "actor_train.model_args.lora_target: 'qkv_proj' matches no module of the model "
        "(e.g. q_proj, v_proj, or all-linear)",
    ),
    (
        ["+actor_train.model_args.lora_alpha=8"],
        "actor_train.model_args.lora_alpha: has no effect without lora_rank; set lora_rank or remove it",
    ),
    (
        [
            "+actor_train.use_dynamic_batching_in_train=true",
            "+actor_train.max_tokens_per_microbatch_in_train=100",
            "sequence_length=128",
        ],
        "actor_train.max_tokens_per_microbatch_in_train: 100 is smaller than one sequence (sequence_length 128, "
        "rounded up to 128)",
    ),
    (
        ["+actor_train.use_dynamic_batching_in_train=true"],
        "actor_train.max_tokens_per_microbatch_in_train: must be set (> 0) with use_dynamic_batching_in_train",
    ),
    (
        [
            "+actor_train.use_dynamic_batching_in_infer=true",
            "+actor_train.max_tokens_per_microbatch_in_infer=120",
            "+actor_train.sequence_length_round_in_infer=64",
            "sequence_length=100",
        ],
        "actor_train.max_tokens_per_microbatch_in_infer: 120 is smaller than one sequence (sequence_length 100, "
        "rounded up to 128)",
    ),
    (
        [
            "actor_train.strategy_args.strategy_name=megatron",
            "+actor_train.model_args.lora_rank=4",
            "+actor_train.model_args.lora_target='q_proj,lm_head'",
        ],
        "actor_train.model_args.lora_target: 'lm_head' has no counterpart in the megatron model (targets: q_proj, "
        "k_proj, v_proj, linear_qkv, o_proj, linear_proj, gate_proj, up_proj, linear_fc1, down_proj, linear_fc2 or "
        "all-linear)",
    ),
]


@pytest.mark.parametrize(("overrides", "expected"), BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_feature_keys_exit_2_naming_the_key(capsys, llama_dir, overrides, expected):
    if "megatron" in overrides[0] and importlib.util.find_spec("megatron") is None:
        pytest.skip("megatron-core is not installed (its install line comes first)")
    status, lines = run_cli(capsys, CONFIG_DIR, CONFIG_NAME, f"pretrain={llama_dir}", *overrides)
    assert_one_line(status, lines, expected)


def test_roll_keys_become_strategy_features(llama_dir):
    cfg = load_config(
        CONFIG_DIR,
        CONFIG_NAME,
        [
            f"pretrain={llama_dir}",
            "+actor_train.model_args.lora_rank=4",
            "+actor_train.model_args.lora_target=all",
            "+actor_train.model_args.disable_gradient_checkpointing=false",
            "+actor_train.model_args.dtype=bf16",
            "+actor_train.use_dynamic_batching_in_train=true",
            "+actor_train.max_tokens_per_microbatch_in_train=4096",
            "+actor_train.sequence_length_round_in_train=128",
        ],
    )
    features = training_features(cfg.actor_train)
    assert features["lora"] == {"rank": 4, "alpha": 8, "target": "all"}  # alpha: 2 x rank, as in ROLL
    assert features["gradient_checkpointing"] is True
    assert features["train_budget"].max_tokens == 4096 and features["train_budget"].round_to == 128
    assert features["infer_budget"] is None
    assert cfg.actor_train.model_args.dtype == "bfloat16"
    off = training_features(load_config(CONFIG_DIR, CONFIG_NAME, [f"pretrain={llama_dir}"]).actor_train)
    assert off == {
        "lora": None,
        "gradient_checkpointing": False,
        "train_budget": None,
        "infer_budget": None,
        "sequence_packing": False,
    }


@pytest.mark.parametrize(
    ("given", "dtype"), [("fp32", "float32"), ("bf16", "bfloat16"), ("fp16", "float16"), ("bfloat16", "bfloat16")]
)
def test_roll_dtype_spellings(given, dtype):
    assert ModelArgs(dtype=given).dtype == dtype
