"""LoRA on the training strategies (roll.models.lora): only adapters train, merged HF weights
leave the strategy, checkpoints are merged HF dirs with the adapter beside them, resume is exact."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from roll.algorithms.actor_loss import PolicyLossOptions
from roll.distributed.workers.actor import ActorWorker
from roll.models.lora import merge_lora_state, unmatched_target
from tests.distributed.ppo_cases import ARGS, ppo_batch

LORA = {"rank": 4, "alpha": 8, "target": "all-linear"}


def _actor(model_dir: str, lora: dict | None = LORA, name: str = "torch") -> ActorWorker:
    return ActorWorker(
        model_dir, ARGS, total_train_steps=4, seed=7, num_threads=1, strategy_name=name, features={"lora": lora}
    )


def _step(actor: ActorWorker, step: int = 0) -> dict:
    return actor.train(
        ppo_batch(actor),
        PolicyLossOptions(entropy_coef=0.01),
        ppo_epochs=1,
        step=step,
    )


def test_only_adapters_train_and_merged_weights_leave(model_dir):
    actor = _actor(model_dir)
    counts = actor.param_counts()
    # peft's adapters by hand, r * (in + out) per Linear of a layer (hidden 32, 2 KV heads of 8, mlp 64):
    # q 32+32, k 32+16, v 32+16, o 32+32, gate 32+64, up 32+64, down 64+32 = 512, x r=4, x 2 layers
    hf_params = AutoModelForCausalLM.from_pretrained(model_dir).num_parameters()
    assert counts == {"model/trainable_params": 4096.0, "model/total_params": float(hf_params + 4096)}
    optimised = {id(p) for group in actor.strategy.optimizer.param_groups for p in group["params"]}
    named = dict(actor.strategy.model.named_parameters())
    assert optimised == {id(p) for n, p in named.items() if "lora_" in n}
    before = {n: p.detach().clone() for n, p in named.items()}
    base = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    assert actor.get_weights().keys() == base.keys()  # HF names, as engines load them
    _step(actor)
    changed = {n for n, p in actor.strategy.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed)
    assert any("lora_B" in n for n in changed)  # B starts at 0: the merged model moved
    merged = actor.get_weights()
    assert not torch.equal(
        merged["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"]
    )
    assert torch.equal(merged["model.embed_tokens.weight"], base["model.embed_tokens.weight"])  # not a target


def test_merge_matches_peft_merge_and_unload(model_dir):
    actor = _actor(model_dir)
    _step(actor)
    peft_model = actor.strategy.model
    merged = merge_lora_state(peft_model.state_dict(), actor.strategy.lora_scaling)
    reference = peft_model.merge_and_unload().state_dict()
    assert merged.keys() == reference.keys()
    for key, value in reference.items():
        torch.testing.assert_close(merged[key], value, rtol=1e-6, atol=1e-6)


def test_checkpoint_is_merged_hf_dir_and_resumes(model_dir, tmp_path):
    actor = _actor(model_dir)
    _step(actor, 0)
    actor.save_checkpoint(str(tmp_path / "ckpt"))
    assert (tmp_path / "ckpt" / "adapter" / "adapter_config.json").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt").state_dict()
    weights = actor.get_weights()
    assert loaded.keys() == weights.keys()
    for key, value in weights.items():
        assert torch.equal(loaded[key], value), key
    want = _step(actor, 1)
    resumed = _actor(model_dir)
    resumed.load_checkpoint(str(tmp_path / "ckpt"))
    got = _step(resumed, 1)
    for key in ("losses/policy_loss", "actor/grad_norm"):
        assert got[key] == pytest.approx(want[key], rel=1e-6), key
    for key, value in actor.get_weights().items():
        torch.testing.assert_close(resumed.get_weights()[key], value, rtol=0, atol=0)


def test_without_lora_every_parameter_trains(model_dir):
    counts = _actor(model_dir, lora=None).param_counts()
    assert counts["model/trainable_params"] == counts["model/total_params"]


def test_lora_target_names():
    names = ["model.layers.0.self_attn.q_proj", "model.layers.0.mlp.up_proj", "lm_head"]
    assert unmatched_target(names, "all-linear") is None
    assert unmatched_target(names, "q_proj, up_proj") is None
    assert "'qkv'" in unmatched_target(names, "q_proj,qkv")


@pytest.mark.parametrize(
    "name, config",
    [("fsdp2", {}), ("deepspeed", {"zero_optimization": {"stage": 3}})],
    ids=["fsdp2", "deepspeed-zero3"],
)
def test_sharded_engines_train_the_same_adapters(model_dir, tmp_path, name, config):
    """One process (gloo): the torch strategy's loss and merged weights; a merged HF checkpoint."""
    pytest.importorskip("deepspeed")
    torch.set_num_threads(1)
    want = _actor(model_dir)
    want_metrics, want_weights = _step(want), want.get_weights()
    actor = ActorWorker(
        model_dir,
        ARGS,
        total_train_steps=4,
        seed=7,
        num_threads=1,
        strategy_name=name,
        strategy_config=config,
        features={"lora": LORA},
    )
    assert actor.param_counts() == want.param_counts()
    got = _step(actor)
    assert got["losses/policy_loss"] == pytest.approx(want_metrics["losses/policy_loss"], rel=1e-6)
    weights = actor.get_weights()
    assert weights.keys() == want_weights.keys()
    for key, value in want_weights.items():
        torch.testing.assert_close(weights[key], value, rtol=1e-5, atol=1e-6)
    actor.save_checkpoint(str(tmp_path / "ckpt"))
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt").state_dict()
    for key, value in weights.items():
        assert torch.equal(loaded[key], value), key


def test_critic_lora_trains_adapters_and_the_new_head(model_dir, tmp_path):
    """The value head is new, so it trains in full (peft's modules_to_save); the checkpoint is a
    merged `*ForTokenClassification` dir and resumes the adapters and the head."""
    from transformers import AutoModelForTokenClassification

    from roll.distributed.workers.critic import CriticWorker

    def critic():
        return CriticWorker(model_dir, ARGS, total_train_steps=4, seed=7, num_threads=1, features={"lora": LORA})

    worker = critic()
    trainable = {n for n, p in worker.strategy.model.named_parameters() if p.requires_grad}
    assert any(".score." in n for n in trainable) and all("lora_" in n or ".score." in n for n in trainable)
    batch = ppo_batch(_actor(model_dir, lora=None)).select("input_ids", "attention_mask", "response_mask")
    batch["values"] = worker.compute_values(batch)
    batch["returns"] = batch["values"] + batch["response_mask"]
    worker.train(batch, ppo_epochs=1, value_clip=None, loss_agg_mode="token-mean", step=0)
    worker.save_checkpoint(str(tmp_path / "critic"))
    weights = worker.strategy.state_dict()
    loaded = AutoModelForTokenClassification.from_pretrained(tmp_path / "critic", num_labels=1).state_dict()
    assert loaded.keys() == weights.keys()
    for key, value in weights.items():
        assert torch.equal(loaded[key], value), key
    resumed = critic()
    resumed.load_checkpoint(str(tmp_path / "critic"))
    for key, value in weights.items():
        assert torch.equal(resumed.strategy.state_dict()[key], value), key
