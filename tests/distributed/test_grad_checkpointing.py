"""Gradient checkpointing (`disable_gradient_checkpointing: false`) changes memory, not results:
the same loss and gradients as without it, on every training strategy that can run here."""

from __future__ import annotations

import functools
import importlib.util

import pytest
import torch
from transformers import AutoModelForCausalLM

from roll.distributed.strategies.registry import build_train_strategy
from tests.distributed.ppo_cases import ARGS, lm_loss, lm_minibatch

ENGINES = {
    "torch": ("torch", {}),
    "fsdp2": ("fsdp2", {}),
    "deepspeed": ("deepspeed", {"zero_optimization": {"stage": 0}}),
    "megatron": ("megatron", {}),
}


def _loss_and_grads(model_dir: str, engine: str, checkpointing: bool, lora: dict | None = None):
    name, config = ENGINES[engine]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    strategy = build_train_strategy(
        model,
        ARGS,
        strategy_name=name,
        strategy_config=config,
        total_steps=4,
        metric_prefix="actor",
        gradient_checkpointing=checkpointing,
        lora=lora,
    )
    captured = {}
    step = strategy._clip_and_step

    def capture_then_step(finite):  # the accumulated gradients, before clipping and the step
        captured.update(
            {n: p.grad.detach().clone() for n, p in strategy.model.named_parameters() if p.grad is not None}
        )
        return step(finite)

    strategy._clip_and_step = capture_then_step
    attention = next(
        m for n, m in strategy.model.named_modules() if n.endswith(("layers.0.self_attn", "layers.0.self_attention"))
    )
    calls = []
    attention.register_forward_pre_hook(lambda *_: calls.append(1))
    inner = lm_loss()

    def loss_fn(model, micro):
        loss, _ = inner(model, micro)
        return loss, {"lm_loss": loss.detach()}

    metrics = strategy.train_step(lm_minibatch(0), loss_fn)
    return strategy, metrics | {"attention_calls": len(calls)}, captured


@pytest.mark.parametrize("engine", list(ENGINES))
def test_same_loss_and_gradients_with_checkpointing(model_dir, engine):
    if (
        engine != "torch"
        and importlib.util.find_spec({"fsdp2": "torch", "deepspeed": "deepspeed", "megatron": "megatron"}[engine])
        is None
    ):
        pytest.skip(f"{engine} is not installed")
    torch.set_num_threads(1)
    _, want, want_grads = _loss_and_grads(model_dir, engine, checkpointing=False)
    strategy, got, got_grads = _loss_and_grads(model_dir, engine, checkpointing=True)
    if engine == "megatron":
        assert all(isinstance(layer.forward, functools.partial) for layer in strategy.gpt.decoder.layers)
    else:
        assert strategy.model.is_activation_checkpointing
    # 2 micro-batches: one forward each, and with checkpointing one recompute each in backward
    assert (want["attention_calls"], got["attention_calls"]) == (2, 4)
    assert got["actor/grad_norm"] == pytest.approx(want["actor/grad_norm"], rel=1e-5)
    assert got["lm_loss"] == pytest.approx(want["lm_loss"], rel=1e-6)
    assert got_grads.keys() == want_grads.keys() and got_grads
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-5, atol=1e-6)


def test_checkpointing_with_lora(model_dir):
    lora = {"rank": 4, "alpha": 8, "target": "all-linear"}
    _, want, want_grads = _loss_and_grads(model_dir, "torch", False, lora)
    _, got, got_grads = _loss_and_grads(model_dir, "torch", True, lora)
    assert got_grads.keys() == want_grads.keys() and all("lora_" in n for n in got_grads)
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-5, atol=1e-6)
