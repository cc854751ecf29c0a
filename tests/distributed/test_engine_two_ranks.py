"""DeepSpeed ZeRO-2/3 and FSDP2 with two data-parallel ranks (two processes, gloo on CPU): each rank
trains on its half of a mini-batch, and the weights after two optimizer steps are those of one
process training on the whole mini-batch with the plain torch strategy. This checks what a single
process cannot: that gradients are averaged across ranks, that clipping uses the global norm, and
that the sharded weights gather back whole."""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp
from ppo_cases import lm_loss, lm_minibatch
from transformers import AutoModelForCausalLM

from roll.configs.worker import TrainingArgs
from roll.distributed.strategies.process_group import free_port
from roll.distributed.strategies.registry import build_train_strategy

pytest.importorskip("deepspeed")
ENGINES = {
    "zero2": ("deepspeed", {"zero_optimization": {"stage": 2}}),
    "zero3": ("deepspeed", {"zero_optimization": {"stage": 3}}),
    "fsdp2": ("fsdp2", {}),
    # ROLL's options at values that keep the numbers: fp32 mixed precision, fsdp_size = all ranks
    "fsdp2_roll_options": (
        "fsdp2",
        {
            "fsdp_size": 2,
            "param_dtype": "fp32",
            "reduce_dtype": "float32",
            "offload_policy": True,
            "reshard_after_forward": False,
        },
    ),
}
ARGS = TrainingArgs(learning_rate=1e-2, per_device_train_batch_size=1, max_grad_norm=0.5)


def _train(model_dir: str, name: str, config: dict, args: TrainingArgs, rows: slice):
    torch.manual_seed(0)
    strategy = build_train_strategy(
        AutoModelForCausalLM.from_pretrained(model_dir),
        args,
        strategy_name=name,
        strategy_config=config,
        total_steps=2,
        metric_prefix="actor",
    )
    norms = [strategy.train_step(lm_minibatch(seed)[rows], lm_loss())["actor/grad_norm"] for seed in (0, 1)]
    return norms, strategy.state_dict()


def _rank(rank: int, model_dir: str, port: int, out_dir: str) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    results = {
        engine: _train(model_dir, name, config, ARGS, slice(2 * rank, 2 * rank + 2))
        for engine, (name, config) in ENGINES.items()
    }
    if rank == 0:
        torch.save(results, os.path.join(out_dir, "results.pt"))


def _hsdp_rank(rank: int, model_dir: str, port: int, out_dir: str) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="4", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    result = _train(model_dir, "fsdp2", {"fsdp_size": 2}, ARGS, slice(rank, rank + 1))
    if rank == 0:
        torch.save(result, os.path.join(out_dir, "hsdp.pt"))


@pytest.mark.lane  # four processes: 5 min on the loaded 2-core machine; .ci/run_lanes runs it
def test_hsdp_four_ranks_shard_in_pairs_and_train_like_one_process(model_dir, tmp_path):
    """fsdp_size 2 of 4 ranks: a (2, 2) mesh, sharded within pairs, replicated across them."""
    from roll.distributed.strategies.fsdp2_train import mesh_shape

    assert mesh_shape(4, 2) == (2, 2) and mesh_shape(4, 4) == (4,) and mesh_shape(4, None) == (4,)
    mp.spawn(_hsdp_rank, args=(model_dir, free_port(), str(tmp_path)), nprocs=4, join=True)
    norms, weights = torch.load(tmp_path / "hsdp.pt", weights_only=True)
    one_process = TrainingArgs(learning_rate=1e-2, per_device_train_batch_size=4, max_grad_norm=0.5)
    want_norms, want_weights = _train(model_dir, "torch", {}, one_process, slice(0, 4))
    assert norms == pytest.approx(want_norms, rel=1e-4)
    for key, value in want_weights.items():
        torch.testing.assert_close(weights[key], value, rtol=1e-4, atol=1e-4, msg=key)


def test_two_ranks_train_like_one_process_on_the_whole_batch(model_dir, tmp_path):
    mp.spawn(_rank, args=(model_dir, free_port(), str(tmp_path)), nprocs=2, join=True)
    results = torch.load(tmp_path / "results.pt", weights_only=True)
    one_process = TrainingArgs(learning_rate=1e-2, per_device_train_batch_size=2, max_grad_norm=0.5)
    want_norms, want_weights = _train(model_dir, "torch", {}, one_process, slice(0, 4))
    assert want_norms[0] > 0.5  # clipping is active, so the global norm matters
    for engine, (norms, weights) in results.items():
        assert norms == pytest.approx(want_norms, rel=1e-4), engine
        for key, value in want_weights.items():
            torch.testing.assert_close(weights[key], value, rtol=1e-4, atol=1e-4, msg=f"{engine} {key}")
