"""`strategy_config: {torch_compile: true}` (torch and fsdp2): the model's forward runs through
TorchInductor and training gives the same losses and weights as without it; the module, its
parameter names and its checkpoints stay those of the HF model. On CUDA the engines pick fused
AdamW where it is theirs to pick (`fused_adamw`); CI has no CUDA, so the choice is tested as a
function, and the fused kernel itself runs here on CPU (torch has one there too) with the choice
forced: the same steps as torch's default, through a resume and an offload."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters
from transformers import AutoModelForCausalLM

import roll.distributed.strategies.torch_train as torch_train
from roll.distributed.strategies.deepspeed_train import DeepSpeedTrainStrategy
from roll.distributed.strategies.fsdp2_train import FSDP2TrainStrategy
from roll.distributed.strategies.registry import build_train_strategy
from roll.distributed.strategies.torch_train import TorchTrainStrategy, fused_adamw
from tests.distributed.ppo_cases import ARGS, WEIGHT_TOL, lm_loss, lm_minibatch


def _two_steps(model_dir: str, engine: str, compiled: bool):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    strategy = build_train_strategy(
        model,
        ARGS,
        strategy_name=engine,
        strategy_config={"torch_compile": compiled},
        total_steps=4,
        metric_prefix="actor",
    )
    norms = [strategy.train_step(lm_minibatch(seed), lm_loss())["actor/grad_norm"] for seed in (0, 1)]
    return strategy, norms


@pytest.mark.parametrize("engine", ["torch", "fsdp2"])
def test_compiled_training_equals_eager(model_dir, engine):
    torch.set_num_threads(1)
    torch._dynamo.reset()
    counters.clear()
    eager, eager_norms = _two_steps(model_dir, engine, compiled=False)
    assert counters["stats"]["calls_captured"] == 0
    compiled, compiled_norms = _two_steps(model_dir, engine, compiled=True)
    assert counters["stats"]["calls_captured"] > 0  # dynamo traced the forward: it really ran compiled
    assert compiled.model._compiled_call_impl is not None and eager.model._compiled_call_impl is None
    assert compiled_norms == pytest.approx(eager_norms, rel=1e-4)
    want, got = eager.state_dict(), compiled.state_dict()
    assert list(got) == list(want)  # HF names: no `_orig_mod.` prefix for checkpoints and weight sync
    for name in want:
        torch.testing.assert_close(got[name], want[name], **WEIGHT_TOL)
    torch._dynamo.reset()


def test_fused_adamw_only_on_cuda_and_where_the_engine_allows():
    assert fused_adamw(torch.device("cuda", 0), allowed=True) is True
    assert fused_adamw(torch.device("cuda", 0), allowed=False) is None
    assert fused_adamw(torch.device("cpu"), allowed=True) is None
    assert TorchTrainStrategy.FUSED_ADAMW and not FSDP2TrainStrategy.FUSED_ADAMW
    assert not DeepSpeedTrainStrategy.FUSED_ADAMW


def test_the_cpu_optimizer_keeps_torchs_default(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    strategy = build_train_strategy(model, ARGS, total_steps=1, metric_prefix="actor")
    assert strategy.optimizer.defaults["fused"] is None


def _steps(strategy, seeds) -> None:
    for seed in seeds:
        strategy.train_step(lm_minibatch(seed), lm_loss())


def _fused(group_owner) -> list:
    return [group["fused"] for group in group_owner.optimizer.param_groups]


def test_fused_adamw_trains_resumes_and_offloads_as_the_default_kernel(model_dir, tmp_path, monkeypatch):
    torch.set_num_threads(1)

    def build():
        return build_train_strategy(
            AutoModelForCausalLM.from_pretrained(model_dir), ARGS, total_steps=4, metric_prefix="actor"
        )

    plain = build()
    _steps(plain, (0, 1))
    plain.save_checkpoint(tmp_path / "ckpt")  # written by the default kernel (fused None)
    monkeypatch.setattr(torch_train, "fused_adamw", lambda device, allowed: True if allowed else None)
    fused = build()
    assert _fused(fused) == [True]
    _steps(fused, (0, 1))
    for name, value in plain.state_dict().items():
        torch.testing.assert_close(fused.state_dict()[name], value, **WEIGHT_TOL)

    resumed = build()
    resumed.load_checkpoint(tmp_path / "ckpt")
    assert _fused(resumed) == [True]  # not the checkpoint's None: resumes on this engine's kernel
    resumed.offload()
    resumed.reload()
    _steps(resumed, (2,))
    _steps(plain, (2,))
    for name, value in plain.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[name], value, **WEIGHT_TOL)
