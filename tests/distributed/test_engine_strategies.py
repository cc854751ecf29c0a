"""The `deepspeed` (ZeRO 0-3) and `fsdp2` training strategies against the plain `torch` one, in
one process on CPU (gloo): the same PPO steps give the same losses and weights, a non-finite loss
skips the update, and checkpoints round-trip (an HF dir plus the optimizer state)."""

from __future__ import annotations

import pytest
import torch
from ppo_cases import ARGS, WEIGHT_TOL, assert_same_training, lm_loss, lm_minibatch, train_two_steps
from transformers import AutoModelForCausalLM

from roll.distributed.strategies.registry import build_train_strategy

pytest.importorskip("deepspeed")
torch.set_num_threads(1)
ENGINES = {
    "deepspeed-zero0": ("deepspeed", {"zero_optimization": {"stage": 0}}),
    "deepspeed-zero1": ("deepspeed", {"zero_optimization": {"stage": 1}}),
    "deepspeed-zero2": ("deepspeed", {"zero_optimization": {"stage": 2}}),
    "deepspeed-zero3": ("deepspeed", {"zero_optimization": {"stage": 3}}),
    "fsdp2": ("fsdp2", {}),
}


@pytest.fixture(scope="module")
def torch_run(model_dir):
    return train_two_steps(model_dir, "torch")


@pytest.mark.parametrize("engine", list(ENGINES))
def test_ppo_steps_match_the_torch_strategy(model_dir, torch_run, engine):
    """Two PPO steps (2 epochs x 2 mini-batches x 2 micro-batches each, clipped): the same losses,
    gradient norms and final weights as the plain torch strategy."""
    assert_same_training(train_two_steps(model_dir, *ENGINES[engine]), torch_run)


def _strategy(model_dir: str, engine: str):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    name, config = ENGINES[engine]
    return build_train_strategy(
        model, ARGS, strategy_name=name, strategy_config=config, total_steps=4, metric_prefix="actor"
    )


@pytest.mark.parametrize("engine", ["deepspeed-zero2", "deepspeed-zero3", "fsdp2"])
def test_non_finite_loss_skips_the_update_and_leaves_no_stale_gradient(model_dir, engine):
    strategy, fresh = _strategy(model_dir, engine), _strategy(model_dir, engine)
    before = strategy.state_dict()
    metrics = strategy.train_step(lm_minibatch(0), lm_loss(float("nan")))
    assert metrics["actor/skipped_steps"] == 1 and metrics["actor/consecutive_skipped_steps"] == 1
    for key, value in strategy.state_dict().items():
        assert torch.equal(value, before[key]), key
    # the next finite step is exactly a first step: nothing of the skipped one leaks into it
    after_skip = strategy.train_step(lm_minibatch(1), lm_loss())
    first = fresh.train_step(lm_minibatch(1), lm_loss())
    assert after_skip["actor/grad_norm"] == pytest.approx(first["actor/grad_norm"], rel=1e-5)
    assert after_skip["actor/consecutive_skipped_steps"] == 0
    fresh_weights = fresh.state_dict()
    for key, value in strategy.state_dict().items():
        torch.testing.assert_close(value, fresh_weights[key], **WEIGHT_TOL, msg=key)


@pytest.mark.parametrize("engine", ["deepspeed-zero1", "deepspeed-zero3", "fsdp2"])
def test_checkpoint_is_an_hf_dir_and_resumes_the_optimizer(model_dir, tmp_path, engine):
    trained = _strategy(model_dir, engine)
    trained.train_step(lm_minibatch(0), lm_loss())
    trained.step_lr_scheduler()
    trained.save_checkpoint(tmp_path)
    saved = AutoModelForCausalLM.from_pretrained(tmp_path).state_dict()
    weights = trained.state_dict()
    for key, value in weights.items():
        torch.testing.assert_close(saved[key], value, msg=key)

    resumed = _strategy(model_dir, engine)
    resumed.load_checkpoint(tmp_path)
    # the second step needs Adam's moments from the first: equal only if they were restored
    want, got = trained.train_step(lm_minibatch(1), lm_loss()), resumed.train_step(lm_minibatch(1), lm_loss())
    assert got["actor/grad_norm"] == pytest.approx(want["actor/grad_norm"], rel=1e-5)
    want_weights = trained.state_dict()
    for key, value in resumed.state_dict().items():
        torch.testing.assert_close(value, want_weights[key], **WEIGHT_TOL, msg=key)


@pytest.mark.parametrize("engine", ["deepspeed-zero1", "deepspeed-zero3", "fsdp2"])
def test_loaded_weights_are_the_ones_trained_next(model_dir, engine):
    """`load_state_dict` reaches the optimizer's own copy (ZeRO keeps fp32 master partitions)."""
    source = _strategy(model_dir, engine)
    source.train_step(lm_minibatch(0), lm_loss())
    plain, loaded = _strategy(model_dir, "deepspeed-zero0"), _strategy(model_dir, engine)
    new_weights = source.state_dict()
    plain.load_state_dict(new_weights)
    loaded.load_state_dict(new_weights)
    want, got = plain.train_step(lm_minibatch(1), lm_loss()), loaded.train_step(lm_minibatch(1), lm_loss())
    assert got["actor/grad_norm"] == pytest.approx(want["actor/grad_norm"], rel=1e-5)
    want_weights = plain.state_dict()
    for key, value in loaded.state_dict().items():
        torch.testing.assert_close(value, want_weights[key], **WEIGHT_TOL, msg=key)


def test_deepspeed_skips_building_its_shm_collective(model_dir):
    """DeepSpeed's first start builds a C++ shared-memory op with ninja (~80 s cold, cached per
    machine, so it would only show on a fresh CI box); gloo does the collectives instead."""
    import sys

    _strategy(model_dir, "deepspeed-zero1")
    backend = sys.modules["deepspeed.comm.comm"].cdb
    assert backend is not None and backend.shm_comm_op is None, "the shm op was built"
