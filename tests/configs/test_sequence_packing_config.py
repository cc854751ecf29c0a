"""ROLL's `use_sequence_packing` / `sequence_packing_args` in a role's config: what the strategy gets,
and the combinations refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from roll.configs import ConfigError, validate_config
from roll.distributed.sequence_packing import PackingBudget
from roll.pipeline.checks.config import check_before_start
from roll.pipeline.setup.builders import training_features

REPO = Path(__file__).parents[2]


@pytest.fixture
def base(model_dir):
    data = yaml.safe_load((REPO / "tests/configs/minimal_agentic.yaml").read_text())
    data.pop("defaults")
    data.update(pretrain=model_dir, val_batch_size=data["rollout_batch_size"])
    return data


def test_packing_reaches_the_strategy_with_rolls_load_balance_plan(base):
    base["actor_train"].update(use_sequence_packing=True)
    features = training_features(validate_config(dict(base)).actor_train)
    assert features["sequence_packing"] and features["train_budget"] is None  # "none": the usual micro-batches
    base["actor_train"]["sequence_packing_args"] = {
        "algorithm": "load_balance",
        "max_packed_sequence_length_train": 512,
        "max_packed_sequence_length_forward": 1024,
        "min_num_micro_batches_train": 2,
    }
    features = training_features(validate_config(base).actor_train)
    assert features["train_budget"] == PackingBudget(512, 2, "sequence_packing_args.max_packed_sequence_length_train")
    assert features["infer_budget"].max_tokens == 1024 and features["infer_budget"].min_micro_batches == 1


@pytest.mark.parametrize(
    ("role", "settings", "key"),
    [
        ("actor_train", {"sequence_packing_args": {"algorithm": "load_balance"}},
         "actor_train.sequence_packing_args.max_packed_sequence_length_train"),
        ("actor_train", {"use_dynamic_batching_in_train": True, "max_tokens_per_microbatch_in_train": 64,
                         "sequence_packing_args": {"algorithm": "load_balance", "max_packed_sequence_length_train": 64,
                                                   "max_packed_sequence_length_forward": 64}},
         "actor_train.use_dynamic_batching_in_train"),
        ("actor_infer", {}, "actor_infer.use_sequence_packing"),
    ],
)  # fmt: skip
def test_packing_combinations_roll_cannot_run_are_named(base, role, settings, key):
    base[role].update(use_sequence_packing=True, **settings)
    with pytest.raises(ConfigError) as err:
        validate_config(base)
    assert err.value.key == key


def test_megatron_actor_packs_its_training_and_log_prob_passes(base):
    """megatron runs packed rows in its thd format (tests/distributed/test_megatron_packing.py),
    with tensor and pipeline parallel; ROLL's load-balanced plan reaches it as on the other engines."""
    base["actor_train"].update(
        use_sequence_packing=True,
        strategy_args={"strategy_name": "megatron_train", "strategy_config": {"tensor_model_parallel_size": 1}},
        sequence_packing_args={"algorithm": "load_balance", "max_packed_sequence_length_train": 64,
                               "max_packed_sequence_length_forward": 64},
    )  # fmt: skip
    base["reference"] = {"use_sequence_packing": True, "strategy_args": {"strategy_name": "megatron_infer"}}
    cfg = validate_config(base)
    check_before_start(cfg)
    features = training_features(cfg.actor_train)
    assert features["sequence_packing"] and features["train_budget"].max_tokens == 64
    assert cfg.reference.use_sequence_packing


@pytest.mark.parametrize(
    ("option", "key"),
    [
        ({"context_parallel_size": 2}, "actor_train.strategy_args.strategy_config.context_parallel_size"),
        ({"sequence_parallel": True}, "actor_train.strategy_args.strategy_config.sequence_parallel"),
    ],
)
def test_megatron_packing_with_a_layout_not_built_stops_before_start(base, option, key):
    """Context parallel would split each packed sequence over ranks, sequence parallel the packed
    row: neither is built for megatron, packed or not, and both stop before start by name."""
    base["actor_train"].update(
        use_sequence_packing=True, strategy_args={"strategy_name": "megatron_train", "strategy_config": option}
    )
    with pytest.raises(ConfigError) as err:
        check_before_start(validate_config(base))
    assert err.value.key == key
