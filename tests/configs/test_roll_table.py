"""The table of ROLL's config fields (roll.configs.roll_compat.table): complete against ROLL's source, and
every entry answered when a YAML sets it: supported fields exist in roll's config, no-op fields load,
refused fields fail naming the key; typos still get a did-you-mean."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from roll.configs import ConfigError, PipelineConfig, validate_config
from roll.configs.roll_compat.keys import TRANSLATED, _model
from roll.configs.roll_compat.table import ROLL_COMMIT, ROLL_TABLE, TOP_LEVEL
from roll.configs.roll_compat.table_workers import WORKER_CONFIG

REPO = Path(__file__).parents[2]
ROLL_GIT_DIR = os.environ.get("ROLL_GIT_DIR", "")  # a clone of alibaba/ROLL (a bare git dir will do)

LOCATIONS = {
    "": TOP_LEVEL,
    "actor_train": ("WorkerConfig",),
    "train_env_manager": ("EnvManagerConfig", "EnvManagerConfig.WorkerConfig"),
    "train_env_manager.llm_proxy": ("LLMProxyConfig",),
    "actor_train.model_args": ("ModelArguments", "LoraArguments"),
    "actor_train.training_args": ("TrainingArguments",),
    "actor_infer.generating_args": ("GeneratingArguments",),
    "actor_train.data_args": ("DataArguments",),
    "actor_train.strategy_args": ("StrategyArguments",),
    "actor_train.sequence_packing_args": ("SequencePackingConfig",),
    "actor_train.router_replay": ("RouterReplayConfig",),
    "reward_normalization": ("RewardNormalizationConfig",),
    "env_monitor": ("EnvMonitorConfig",),
    "rollout_mock": ("RolloutMockConfig",),
    "router_args": ("RouterArguments",),
    "transfer_backend": ("TransferBackendArguments",),
    "train_infer_correction": ("TrainInferCorrectionConfig",),
    "train_infer_correction.is_weight": ("TrainInferISWeightConfig",),
    "train_infer_correction.filters.0": ("TrainInferFilterConfig",),
}
"""Where each ROLL class's fields sit in a YAML (RewardConfig: under `reward`, refused whole)."""
ENTRIES = [(path, cls, name) for path, classes in LOCATIONS.items() for cls in classes for name in ROLL_TABLE[cls]]


def _roll_fields_script():
    spec = importlib.util.spec_from_file_location("roll_fields", REPO / "scripts" / "roll_fields.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not os.path.isdir(ROLL_GIT_DIR), reason="no ROLL clone: set ROLL_GIT_DIR to one")
def test_table_has_every_field_of_rolls_classes_and_no_other():
    source = _roll_fields_script().roll_fields(ROLL_GIT_DIR, ROLL_COMMIT)
    table = {cls: set(fields) for cls, fields in ROLL_TABLE.items() if cls != "EnvManagerConfig.WorkerConfig"}
    assert table == {cls: set(fields) for cls, fields in source.items()}


def test_env_managers_answer_every_inherited_worker_field():
    assert set(ROLL_TABLE["EnvManagerConfig.WorkerConfig"]) == set(WORKER_CONFIG)


def test_every_class_of_the_table_has_a_place_in_the_yaml():
    placed = {cls for classes in LOCATIONS.values() for cls in classes}
    assert set(ROLL_TABLE) - placed == {"RewardConfig"}  # its one field lives in `reward`, refused whole


def _model_at(path: str):
    model = PipelineConfig
    for part in filter(None, path.split(".")):
        if part.isdigit():
            continue
        if model is None or part not in model.model_fields:
            return None
        model = _model(model.model_fields[part].annotation)
    return model


@pytest.mark.parametrize(("path", "cls", "name"), ENTRIES, ids=[f"{c}.{n}" for _, c, n in ENTRIES])
def test_supported_means_a_field_of_rolls_config_and_no_op_means_none(path, cls, name):
    answer = ROLL_TABLE[cls][name]
    model = _model_at(path)
    ours = model is not None and name in model.model_fields
    if answer.kind == "supported":
        assert ours or (path == "" and name in TRANSLATED), f"{path}.{name} is supported but not a field of roll"
    if answer.kind == "no-op":
        assert not ours, f"{path}.{name}: a field of roll's config has roll's meaning, not a no-op"
    assert answer.why


@pytest.fixture
def base(model_dir):
    import yaml

    data = yaml.safe_load((REPO / "tests/configs/minimal_agentic.yaml").read_text())
    data.pop("defaults")
    data["pretrain"] = model_dir
    data["val_batch_size"] = data["rollout_batch_size"]
    return data


def _set(data: dict, path: str, name: str, value) -> None:
    node = data
    for part in filter(None, path.split(".")):
        if part == "filters":
            node = node.setdefault(part, [{}])
        elif part.isdigit():
            node = node[int(part)]
        else:
            node = node.setdefault(part, {})
    node[name] = value


def _a_value_it_refuses(answer):
    return next(v for v in (True, 2, "x", {"x": 1}, [1]) if not answer.accepts(v))


REFUSED = [(p, c, n) for p, c, n in ENTRIES if ROLL_TABLE[c][n].kind == "refused"]
NO_OPS = [(p, c, n) for p, c, n in ENTRIES if ROLL_TABLE[c][n].kind == "no-op"]


@pytest.mark.parametrize(("path", "cls", "name"), REFUSED, ids=[f"{c}.{n}" for _, c, n in REFUSED])
def test_a_refused_field_is_named_with_why_unless_it_is_off(base, path, cls, name):
    answer = ROLL_TABLE[cls][name]
    key = f"{path}.{name}".lstrip(".")
    on = dict(base)
    _set(on, path, name, _a_value_it_refuses(answer))
    with pytest.raises(ConfigError) as err:
        validate_config(on)
    assert err.value.key == key and "unknown key" not in err.value.message
    _set(base, path, name, answer.off[0])
    validate_config(base)  # off: accepted


@pytest.mark.parametrize(("path", "cls", "name"), NO_OPS, ids=[f"{c}.{n}" for _, c, n in NO_OPS])
def test_a_no_op_field_loads_with_any_value(base, path, cls, name):
    reference = validate_config(dict(base))
    _set(base, path, name, "anything")
    assert validate_config(base) == reference


@pytest.mark.parametrize(
    ("path", "typo", "meant"),
    [
        ("actor_train", "use_sequence_pakcing", "use_sequence_packing"),
        ("", "max_ckpt_to_kep", "max_ckpt_to_keep"),
        ("", "dual_clip_los", "dual_clip_loss"),
        ("router_args", "router_nmae", "router_name"),
        ("actor_train.model_args", "lora_dropuot", "lora_dropout"),
    ],
)
def test_a_true_typo_still_gets_did_you_mean(base, path, typo, meant):
    _set(base, path, typo, True)
    with pytest.raises(ConfigError) as err:
        validate_config(base)
    assert err.value.key == f"{path}.{typo}".lstrip(".")
    assert f"did you mean {meant!r}" in err.value.message


def test_response_length_becomes_sequence_length_as_in_roll(base):
    base.update(response_length=300, prompt_length=200)
    assert validate_config(dict(base)).sequence_length == 500
    base.pop("prompt_length")
    assert validate_config(dict(base)).sequence_length == 1324  # ROLL's default prompt_length 1024
    base.update(sequence_length=900)  # given: ROLL ignores response_length
    assert validate_config(base).sequence_length == 900


def test_use_pg_clip_range_keeps_rolls_meaning(base):
    base.update(pg_clip=0.1, pg_clip_high=0.28)
    assert validate_config(dict(base)).pg_clip_high == 0.28  # roll's own: given bounds are used
    off = validate_config({**base, "use_pg_clip_range": False})  # ROLL: pg_clip, the two ignored
    assert off.pg_clip_low is None and off.pg_clip_high is None
    on = validate_config({**base, "use_pg_clip_range": True})  # ROLL: the two, 0.2 when left out
    assert (on.pg_clip_low, on.pg_clip_high) == (0.2, 0.28)


def test_the_coming_from_roll_page_is_generated_from_the_table():
    import subprocess
    import sys

    check = [sys.executable, str(REPO / "scripts" / "coming_from_roll.py"), "--check"]
    result = subprocess.run(check, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_roll_fields_work_as_command_line_overrides(model_dir):
    from roll.configs import load_config

    overrides = [f"pretrain={model_dir}", "response_length=100", "max_ckpt_to_keep=2", "local_rank=3"]
    cfg = load_config(str(REPO / "tests/configs"), "minimal_agentic", overrides)
    assert cfg.sequence_length == 1124 and cfg.max_ckpt_to_keep == 2
    with pytest.raises(ConfigError) as err:
        load_config(str(REPO / "tests/configs"), "minimal_agentic", [f"pretrain={model_dir}", "use_opd=true"])
    assert err.value.key == "use_opd" and "distillation" in err.value.message
