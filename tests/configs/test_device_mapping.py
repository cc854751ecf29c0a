"""`device_mapping` in the config: ROLL's string form, the replicas it implies, the layouts refused
before anything starts (one line naming the key), and the CLI's exit 2 when this machine has no
GPU for a list."""

from __future__ import annotations

import os

import pytest
import torch

from roll.cli import main
from roll.configs import ConfigError, load_config
from roll.pipeline.checks.config import check_before_start

CONFIG_DIR = os.path.dirname(os.path.abspath(__file__))
GPU_RUN = ["+actor_train.device_mapping=[0]", "+actor_infer.device_mapping=[0]"]


def load(model_dir, *overrides):
    """The config as the CLI takes it: validated, then checked before the run starts."""
    cfg = load_config(CONFIG_DIR, "minimal_agentic", [f"pretrain={model_dir}", *overrides])
    check_before_start(cfg)
    return cfg


def error_of(model_dir, *overrides) -> str:
    with pytest.raises(ConfigError) as info:
        load(model_dir, *overrides)
    return str(info.value)


def test_roll_range_string_and_one_replica_per_device(model_dir):
    cfg = load(model_dir, "+actor_train.device_mapping=[0]", "+actor_infer.device_mapping='list(range(0,4))'")
    assert cfg.actor_infer.device_mapping == [0, 1, 2, 3]
    assert cfg.inference_replicas == 4
    assert list(cfg.built_roles) == ["actor_train", "actor_infer"]  # no critic, no KL: no reference
    assert load(model_dir).inference_replicas == 1


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["+actor_train.device_mapping=[0]"],
            "actor_infer.device_mapping: null (CPU) while actor_train.device_mapping lists GPUs; place every role "
            "on GPUs or every role on CPU (null)",
        ),
        (
            [*GPU_RUN, "async_generation_ratio=1"],
            "async_generation_ratio: 1 needs actor_infer on GPUs of its own, but it shares [0] with actor_train: "
            "rollout then runs while actor_train works, so neither can be offloaded for the other; use 0 or give "
            "actor_infer other devices",
        ),
        (
            ["+actor_train.device_mapping='list(range(0,8))'", "+actor_infer.device_mapping='list(range(0,8))'"],
            "actor_train.strategy_args.strategy_name: 'torch' does not average gradients over the 8 ranks of "
            "actor_train (world_size); use deepspeed, fsdp2, megatron, or one rank",
        ),
        (
            ["+actor_train.world_size=2"],
            "actor_train.strategy_args.strategy_name: 'torch' does not average gradients over the 2 ranks of "
            "actor_train (world_size); use deepspeed, fsdp2, megatron, or one rank",
        ),
        (
            [*GPU_RUN, "+actor_train.world_size=2"],
            "actor_train.world_size: 2, but device_mapping [0] lists 1 (one rank per device): set it to 1 or leave "
            "it out",
        ),
        (
            ["+actor_infer.world_size=2"],
            "actor_infer.world_size: 2 on CPU; the engine's processes are its replicas: set "
            "actor_infer.strategy_args.strategy_config.num_replicas instead",
        ),
        (
            [*GPU_RUN, "+actor_infer.strategy_args.strategy_config.num_replicas=2"],
            "actor_infer.strategy_args.strategy_config.num_replicas: 2 replicas for actor_infer.device_mapping [0]; "
            "each replica is one process on one device (tensor parallel is not built): set it to 1 or leave it out",
        ),
        (
            ["+actor_train.device_mapping=[]"],
            "actor_train.device_mapping: an empty list places the role nowhere; use null to run it on CPU",
        ),
        (
            ["+actor_train.device_mapping='range(8)'"],
            "actor_train.device_mapping: expected a list of GPU indices, null, or 'list(range(a, b))' (got 'range(8)')",
        ),
    ],
)
def test_bad_layouts_name_the_key(model_dir, overrides, expected):
    assert error_of(model_dir, *overrides) == expected


def test_world_size_is_the_device_count_or_the_cpu_processes(model_dir):
    sharded = "actor_train.strategy_args.strategy_name=fsdp2"
    cfg = load(
        model_dir,
        sharded,
        "+actor_train.device_mapping='list(range(0,4))'",
        "+actor_infer.device_mapping='list(range(0,4))'",
    )
    assert (cfg.actor_train.world_size, cfg.actor_infer.world_size, cfg.inference_replicas) == (4, 4, 4)
    assert load(model_dir).actor_train.world_size == 1
    assert load(model_dir, sharded, "+actor_train.world_size=3").actor_train.world_size == 3
    assert error_of(model_dir, "+actor_train.world_size=0").startswith("actor_train.world_size: ")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without a GPU")
def test_cli_without_a_gpu_exits_2_with_one_line(model_dir, capsys):
    status = main(["--config_path", CONFIG_DIR, "--config_name", "minimal_agentic", f"pretrain={model_dir}", *GPU_RUN])
    assert status == 2
    assert capsys.readouterr().err.splitlines() == [
        "config error: actor_train.device_mapping: [0] needs CUDA GPUs, and none is visible here; use null "
        "to run on CPU (or add +profile=cpu_smoke to shrink the whole config to this machine)"
    ]
