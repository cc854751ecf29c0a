"""The strategy registry: ROLL's names and our aliases reach the same engine, every engine the
config accepts is registered, and an unknown name is a one-line error listing the choices."""

import pytest

from roll.configs.worker import INFERENCE_STRATEGIES, STRATEGY_ALIASES, TRAINING_STRATEGIES
from roll.distributed.strategies.registry import (
    INFER_STRATEGIES,
    TRAIN_STRATEGIES,
    canonical_name,
    strategy_class,
)


def test_every_engine_the_config_accepts_is_registered_under_its_roll_name():
    assert sorted(canonical_name(n) for n in TRAINING_STRATEGIES) == sorted(TRAIN_STRATEGIES)
    assert sorted(canonical_name(n) for n in INFERENCE_STRATEGIES) == sorted(INFER_STRATEGIES)
    for roll_name, short in STRATEGY_ALIASES.items():  # the config's normalisation agrees
        assert canonical_name(short) == canonical_name(roll_name)


def test_both_spellings_give_the_same_class_and_only_the_chosen_engine_is_imported():
    assert strategy_class("torch", kind="train") is strategy_class("torch_train", kind="train")
    assert strategy_class("hf", kind="infer").__name__ == "HFInferStrategy"


def test_unknown_or_wrong_kind_names_the_choices():
    with pytest.raises(ValueError, match="unknown training strategy 'fsdp'; choose one of torch, deepspeed"):
        strategy_class("fsdp", kind="train")
    with pytest.raises(ValueError, match="unknown inference strategy 'torch'"):
        strategy_class("torch", kind="infer")
