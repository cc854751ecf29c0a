"""LoRA on the `megatron` strategy (roll.distributed.strategies.megatron.lora), one process, TP 1:
the target mapping and the adapter's tensor-parallel cuts and HF export by hand, then the strategy:
only adapters train, weights leave merged (base + scale * B A), the checkpoint is a merged HF dir
whose `adapter/` is a peft adapter giving the megatron model's loss, and resume is exact.
TP 2 is in tests/lanes/megatron_lora_tp_check.py (the .ci/run_megatron_tp lane)."""

from __future__ import annotations

import pytest
import torch
from ppo_cases import ARGS, lm_loss, lm_minibatch
from transformers import AutoModelForCausalLM

from roll.distributed.strategies.megatron.convert import DecoderArch, fuse_qkv, megatron_to_hf
from roll.distributed.strategies.registry import build_train_strategy

pytest.importorskip("megatron.core", reason="needs megatron-core (the test extra installs it)")
from roll.distributed.strategies.megatron import lora as ml  # noqa: E402

torch.set_num_threads(1)
LORA = {"rank": 4, "alpha": 8, "target": "all-linear"}
ARCH = DecoderArch(
    num_layers=1,
    hidden_size=4,
    ffn_hidden_size=4,
    num_heads=4,
    num_query_groups=2,
    head_dim=2,
    vocab_size=8,
    qkv_bias=False,
    tied_embeddings=False,
    rope_theta=1e4,
    norm_eps=1e-6,
    max_positions=16,
)


# ---- pure functions, by hand ----------------------------------------------------------------
def test_targets_map_hf_names_to_the_fused_layers():
    assert ml.megatron_targets("q_proj, v_proj") == [ml.QKV]  # one adapter on the fused qkv
    assert ml.megatron_targets("down_proj,o_proj,up_proj") == [ml.PROJ, ml.FC1, ml.FC2]
    assert ml.megatron_targets("linear_qkv,linear_fc2") == [ml.QKV, ml.FC2]  # ROLL's megatron names
    assert ml.megatron_targets("all-linear") == ml.megatron_targets("all") == [ml.QKV, ml.PROJ, ml.FC1, ml.FC2]
    with pytest.raises(ValueError, match="^'lm_head' has no counterpart in the megatron model"):
        ml.megatron_targets("q_proj,lm_head")
    with pytest.raises(ValueError, match="lists no module name"):
        ml.megatron_targets(" , ")


def rows(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)[:, None]


def test_tensor_parallel_cuts_by_hand():
    """TP 2: column layers keep A whole and cut B by rows (fc1 per gate/up half: rank 1 holds gate
    rows 2-3 and up rows 12-13); row layers cut A by columns and keep B whole."""
    adapter = {
        f"decoder.layers.0.{ml.FC1}.lora_A": torch.ones(1, 4),
        f"decoder.layers.0.{ml.FC1}.lora_B": rows(0, 1, 2, 3, 10, 11, 12, 13),
        f"decoder.layers.0.{ml.PROJ}.lora_A": torch.arange(4.0)[None],
        f"decoder.layers.0.{ml.PROJ}.lora_B": rows(5, 6),
    }
    shards = ml.split_adapter(adapter, 2)
    assert shards[1][f"decoder.layers.0.{ml.FC1}.lora_B"][:, 0].tolist() == [2, 3, 12, 13]
    assert torch.equal(shards[1][f"decoder.layers.0.{ml.FC1}.lora_A"], torch.ones(1, 4))
    assert shards[1][f"decoder.layers.0.{ml.PROJ}.lora_A"].tolist() == [[2, 3]]
    assert shards[1][f"decoder.layers.0.{ml.PROJ}.lora_B"][:, 0].tolist() == [5, 6]
    merged = ml.merge_adapter(shards)
    assert all(torch.equal(merged[k], v) for k, v in adapter.items())
    # each rank's B_local @ A_local is its shard of the merged delta (what merged_state relies on)
    full_delta = adapter[f"decoder.layers.0.{ml.PROJ}.lora_B"] @ adapter[f"decoder.layers.0.{ml.PROJ}.lora_A"]
    local = shards[1][f"decoder.layers.0.{ml.PROJ}.lora_B"] @ shards[1][f"decoder.layers.0.{ml.PROJ}.lora_A"]
    assert torch.equal(local, full_delta[:, 2:])


def test_merge_and_hf_export_by_hand():
    """q/k/v rows of the fused B go to their HF projections; every part shares A; the exported
    adapter's B_q A is the q rows of the fused B A."""
    a = torch.tensor([[1.0, 0, 0, 0]])
    b = fuse_qkv(rows(*range(8)), rows(10, 11, 12, 13), rows(20, 21, 22, 23), ARCH)
    state = {
        f"decoder.layers.0.{ml.QKV}.base_layer.weight": torch.zeros(16, 4),
        f"decoder.layers.0.{ml.QKV}.lora_A": a,
        f"decoder.layers.0.{ml.QKV}.lora_B": b,
        "decoder.final_layernorm.weight": torch.ones(4),
    }
    merged = ml.merged_state(state, scaling=0.5)
    assert list(merged) == [f"decoder.layers.0.{ml.QKV}.weight", "decoder.final_layernorm.weight"]
    assert merged[f"decoder.layers.0.{ml.QKV}.weight"][:, 0].tolist() == [0.5 * x for x in b[:, 0].tolist()]
    hf = ml.adapter_to_hf(ml.adapter_state(state), ARCH)
    prefix = "base_model.model.model.layers.0.self_attn."
    assert hf[f"{prefix}k_proj.lora_B.weight"][:, 0].tolist() == [10, 11, 12, 13]
    assert torch.equal(hf[f"{prefix}v_proj.lora_A.weight"], a)
    back = ml.adapter_from_hf(hf, ARCH, [f"decoder.layers.0.{ml.QKV}"])
    assert all(torch.equal(back[k], v) for k, v in ml.adapter_state(state).items())
    hf[f"{prefix}k_proj.lora_A.weight"] = torch.zeros(1, 4)  # an adapter trained on the HF model
    with pytest.raises(ValueError, match="different A matrices for the parts of decoder.layers.0"):
        ml.adapter_from_hf(hf, ARCH, [f"decoder.layers.0.{ml.QKV}"])


# ---- the strategy ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def megatron_groups():
    from roll.distributed.strategies.megatron import model as megatron_model
    from roll.distributed.strategies.process_group import ensure_process_group

    ensure_process_group(torch.device("cpu"))
    megatron_model.init_model_parallel()


def _strategy(model_dir: str, name: str = "megatron", lora: dict | None = LORA):
    torch.manual_seed(7)  # as the worker seeds its process: the adapters' A comes from it
    return build_train_strategy(
        AutoModelForCausalLM.from_pretrained(model_dir),
        ARGS,
        strategy_name=name,
        total_steps=4,
        metric_prefix="actor",
        lora=lora,
    )


def _hand_merged(strategy) -> dict[str, torch.Tensor]:
    """HF weights of base + (alpha / r) * B @ A in every wrapped layer, from the parameters."""
    params = {k: v.detach() for k, v in strategy.gpt.state_dict().items() if torch.is_tensor(v)}
    plain = {}
    for name, value in params.items():
        if name.endswith((".lora_A", ".lora_B")):
            continue
        module, _, param = name.partition(".base_layer.")
        if param:
            value = value + LORA["alpha"] / LORA["rank"] * params[f"{module}.lora_B"] @ params[f"{module}.lora_A"]
            name = f"{module}.{param}"
        plain[name] = value
    return megatron_to_hf(plain, strategy.arch)


def test_only_adapters_train_and_leave_merged(model_dir, megatron_groups):
    strategy, torch_lora = _strategy(model_dir), _strategy(model_dir, "torch")
    optimised = {id(p) for group in strategy.optimizer.param_groups for p in group["params"]}
    named = dict(strategy.gpt.named_parameters())
    assert optimised == {id(p) for n, p in named.items() if n.endswith((".lora_A", ".lora_B"))}
    assert len(optimised) == 2 * 4 * 2  # A and B on four layers of each of the 2 decoder layers
    counts = strategy.param_counts
    assert counts["model/total_params"] > counts["model/trainable_params"] > 0
    hf_params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters())
    assert counts["model/total_params"] - counts["model/trainable_params"] == hf_params
    plain = _strategy(model_dir, lora=None).param_counts  # HF's count, not megatron's padded shards
    assert plain["model/trainable_params"] == plain["model/total_params"] == hf_params
    batch = lm_minibatch(2)
    with torch.no_grad():  # B = 0 at the start on both: the base model's loss through either adapter
        want = torch_lora.model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss
        got = strategy.model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss
    assert float(got) == pytest.approx(float(want), abs=1e-6)
    before = {n: p.detach().clone() for n, p in named.items()}
    base = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    for seed in range(2):
        assert strategy.train_step(lm_minibatch(seed), lm_loss())["actor/skipped_steps"] == 0
    changed = {n for n, p in strategy.gpt.named_parameters() if not torch.equal(p, before[n])}
    assert changed == {n for n in named if n.endswith((".lora_A", ".lora_B"))}
    merged = strategy.state_dict()
    assert list(merged) == list(base)
    for key, value in _hand_merged(strategy).items():
        torch.testing.assert_close(merged[key], value, rtol=0, atol=1e-6, msg=key)
    assert not torch.equal(
        merged["model.layers.0.self_attn.k_proj.weight"], base["model.layers.0.self_attn.k_proj.weight"]
    )
    assert torch.equal(merged["model.embed_tokens.weight"], base["model.embed_tokens.weight"])  # never adapted


def test_checkpoint_is_merged_with_a_peft_adapter_and_resumes(model_dir, megatron_groups, tmp_path):
    from peft import PeftModel

    trained = _strategy(model_dir)
    for seed in range(2):
        trained.train_step(lm_minibatch(seed), lm_loss())
        trained.step_lr_scheduler()
    trained.save_checkpoint(tmp_path)
    saved = AutoModelForCausalLM.from_pretrained(tmp_path).state_dict()
    for key, value in trained.state_dict().items():
        assert torch.equal(saved[key], value), key
    # the adapter beside it, on the untouched HF model through peft, is the megatron model
    batch = lm_minibatch(3)
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), tmp_path / "adapter")
    with torch.no_grad():
        want = trained.model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss
        via_peft = peft_model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss
    assert float(via_peft) == pytest.approx(float(want), abs=1e-5)

    resumed = _strategy(model_dir)
    resumed.load_checkpoint(tmp_path)
    # the next step needs Adam's moments: equal only if they were restored with the adapters
    want_step, got_step = trained.train_step(batch, lm_loss()), resumed.train_step(batch, lm_loss())
    assert got_step["actor/grad_norm"] == pytest.approx(want_step["actor/grad_norm"], rel=1e-6)
    assert got_step["actor/lr"] == want_step["actor/lr"]
    want_weights = trained.state_dict()
    for key, value in resumed.state_dict().items():
        torch.testing.assert_close(value, want_weights[key], rtol=0, atol=1e-6, msg=key)
