"""The `megatron` strategy on CPU, one process: the HF <-> Megatron weight conversion (by hand, round
trips, a real `GPTModel`'s keys and shapes, tensor-parallel shards), the adapter's logits against
the HF model's, and PPO steps, checkpoints and weight loading against the plain torch strategy.
Two ranks (tensor and data parallel) are in test_megatron_two_ranks.py."""

from __future__ import annotations

import os
import re

import pytest
import torch
from ppo_cases import ARGS, VOCAB, WEIGHT_TOL, assert_same_training, lm_loss, lm_minibatch, train_two_steps
from transformers import AutoModelForCausalLM, LlamaForTokenClassification, Qwen2Config, Qwen2ForCausalLM

from roll.distributed.strategies.megatron.convert import (
    DecoderArch,
    arch_from_hf,
    fuse_qkv,
    hf_to_megatron,
    megatron_to_hf,
    merge_tensor_parallel,
    split_qkv,
    split_tensor_parallel,
)
from roll.distributed.strategies.registry import build_train_strategy

pytest.importorskip("megatron.core", reason="needs megatron-core (the test extra installs it)")
from roll.distributed.strategies.megatron import model as megatron_model  # noqa: E402  (imports megatron-core)

torch.set_num_threads(1)


def tiny_arch(**overrides) -> DecoderArch:
    sizes = dict(
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
    return DecoderArch(**(sizes | overrides))


def rows(*values: int) -> torch.Tensor:
    """A (n, 1) tensor whose row i holds values[i]: a weight whose rows can be followed by name."""
    return torch.tensor(values, dtype=torch.float32)[:, None]


# ---- conversion, by hand -------------------------------------------------------------------
def test_qkv_interleave_by_hand():
    """4 query heads, 2 KV heads, head_dim 2: rows 2h, 2h+1 are head h. Group g holds query heads
    2g and 2g+1, then k_g, then v_g."""
    arch = tiny_arch()
    q, k, v = rows(*range(8)), rows(10, 11, 12, 13), rows(20, 21, 22, 23)
    fused = fuse_qkv(q, k, v, arch)
    want = [
        0,
        1,
        2,
        3,
        10,
        11,
        20,
        21,  # group 0: q heads 0-1, k head 0, v head 0
        4,
        5,
        6,
        7,
        12,
        13,
        22,
        23,
    ]  # group 1: q heads 2-3, k head 1, v head 1
    assert fused[:, 0].tolist() == want
    assert all(torch.equal(a, b) for a, b in zip(split_qkv(fused, arch), (q, k, v), strict=True))
    bias = fuse_qkv(q[:, 0], k[:, 0], v[:, 0], arch)  # 1-D tensors (Qwen2's biases) alike
    assert bias.tolist() == want


def test_tensor_parallel_split_by_hand():
    """TP 2: rank r holds query group r of linear_qkv, [gate_r; up_r] of linear_fc1, half the
    vocabulary rows, half of the input columns of row-parallel layers, and every norm whole."""
    arch = tiny_arch()
    qkv = fuse_qkv(rows(*range(8)), rows(10, 11, 12, 13), rows(20, 21, 22, 23), arch)
    state = {
        "decoder.layers.0.self_attention.linear_qkv.weight": qkv,
        "decoder.layers.0.mlp.linear_fc1.weight": rows(0, 1, 2, 3, 10, 11, 12, 13),  # gate 0-3, up 10-13
        "decoder.layers.0.mlp.linear_fc2.weight": torch.arange(8.0).reshape(2, 4),
        "embedding.word_embeddings.weight": rows(*range(8)),
        "decoder.final_layernorm.weight": torch.ones(4),
    }
    shards = split_tensor_parallel(state, arch, 2)
    assert shards[1]["decoder.layers.0.self_attention.linear_qkv.weight"][:, 0].tolist() == [4, 5, 6, 7, 12, 13, 22, 23]
    assert shards[0]["decoder.layers.0.mlp.linear_fc1.weight"][:, 0].tolist() == [0, 1, 10, 11]
    assert shards[1]["decoder.layers.0.mlp.linear_fc1.weight"][:, 0].tolist() == [2, 3, 12, 13]
    assert shards[1]["decoder.layers.0.mlp.linear_fc2.weight"].tolist() == [[2, 3], [6, 7]]
    assert shards[1]["embedding.word_embeddings.weight"][:, 0].tolist() == [4, 5, 6, 7]
    assert torch.equal(shards[1]["decoder.final_layernorm.weight"], torch.ones(4))
    merged = merge_tensor_parallel(shards)
    assert all(torch.equal(merged[k], v) for k, v in state.items())
    with pytest.raises(ValueError, match="tensor parallel size 4 does not divide num_query_groups = 2"):
        split_tensor_parallel(state, arch, 4)


def test_unsupported_hf_configs_fail_in_one_line():
    config = Qwen2Config(hidden_size=8, num_attention_heads=2, num_hidden_layers=1, use_sliding_window=True)
    with pytest.raises(ValueError, match="unsupported sliding-window attention"):
        arch_from_hf(config)
    config = Qwen2Config(hidden_size=8, num_attention_heads=2, num_hidden_layers=1, hidden_act="gelu")
    with pytest.raises(ValueError, match="unsupported hidden_act"):
        arch_from_hf(config)


# ---- conversion against real models --------------------------------------------------------
@pytest.fixture(scope="module")
def qwen2() -> Qwen2ForCausalLM:
    """A 2-layer Qwen2 with q/k/v biases, tied embeddings, 4 query / 2 KV heads and a vocabulary
    (31) that tensor parallelism must pad; every weight, bias and norm is random, so a tensor
    in the wrong place shows in the logits."""
    torch.manual_seed(1)
    config = Qwen2Config(
        vocab_size=31,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        rope_theta=1e6,
    )
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.1)
    return model


@pytest.fixture(scope="module")
def llama(model_dir) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def hf_model(request):
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def megatron_groups():
    """The one-process default group and megatron's groups over it (shared with the strategy)."""
    from roll.distributed.strategies.process_group import ensure_process_group

    ensure_process_group(torch.device("cpu"))
    megatron_model.init_model_parallel()


def megatron_lm(hf):
    arch = arch_from_hf(hf.config)
    gpt = megatron_model.build_gpt_model(arch, torch.float32)
    megatron_model.load_megatron_state(gpt, hf_to_megatron(hf.state_dict(), arch))
    return megatron_model.MegatronCausalLM(gpt, arch.vocab_size).eval()


def test_round_trip_is_bit_exact(hf_model):
    arch = arch_from_hf(hf_model.config)
    want = hf_model.state_dict()
    back = megatron_to_hf(hf_to_megatron(want, arch, padded_vocab_size=arch.vocab_size + 1), arch)
    assert back.keys() == want.keys()
    for key, value in want.items():
        assert torch.equal(back[key], value), key


def test_transformer_engine_switches_of_a_roll_config_do_not_stop_the_build(hf_model, megatron_groups, monkeypatch):
    # ROLL's configs set these in system_envs; megatron asserts they match its attention backend
    # (auto wants all three 1). Our attention is SDPA, so they are hidden during the build and kept.
    monkeypatch.setenv("NVTE_FLASH_ATTN", "1")
    monkeypatch.setenv("NVTE_FUSED_ATTN", "0")
    megatron_model.build_gpt_model(arch_from_hf(hf_model.config), torch.float32)
    assert (os.environ["NVTE_FLASH_ATTN"], os.environ["NVTE_FUSED_ATTN"]) == ("1", "0")
    assert "NVTE_UNFUSED_ATTN" not in os.environ


def test_converted_weights_fit_a_real_gpt_model(hf_model, megatron_groups):
    arch = arch_from_hf(hf_model.config)
    gpt = megatron_model.build_gpt_model(arch, torch.float32)
    want = {k: v.shape for k, v in gpt.state_dict().items() if not k.endswith("_extra_state")}
    converted = hf_to_megatron(hf_model.state_dict(), arch)
    assert {k: v.shape for k, v in converted.items()} == want
    megatron_model.load_megatron_state(gpt, converted)  # strict


class _StandInGroup:
    """What building a tensor-parallel layer asks of its group: this rank and the group size."""

    def __init__(self, rank: int, size: int) -> None:
        self._rank, self._size = rank, size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


def test_tensor_parallel_shards_fit_each_rank_of_a_tp2_model(hf_model, megatron_groups):
    """Split for TP 2 and merged back: exact; each shard has the shapes of that rank's TP-2
    `GPTModel` (built in this process: construction only asks the group for rank and size)."""
    from megatron.core.process_groups_config import ProcessGroupCollection

    arch = arch_from_hf(hf_model.config)
    full = hf_to_megatron(hf_model.state_dict(), arch, megatron_model.padded_vocab_size(arch, 2))
    shards = split_tensor_parallel(full, arch, 2)
    merged = merge_tensor_parallel(shards)
    assert merged.keys() == full.keys() and all(torch.equal(merged[k], v) for k, v in full.items())
    for rank, shard in enumerate(shards):
        groups = ProcessGroupCollection.use_mpu_process_groups()
        groups.tp = _StandInGroup(rank, 2)
        gpt = megatron_model.build_gpt_model(arch, torch.float32, tensor_parallel=2, pg_collection=groups)
        want = {k: v.shape for k, v in gpt.state_dict().items() if not k.endswith("_extra_state")}
        assert {k: v.shape for k, v in shard.items()} == want


# ---- the adapter's forward -----------------------------------------------------------------
def padded_batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of 9 tokens: no padding, right padding, left padding."""
    ids = torch.randint(0, vocab, (3, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, :3] = 0
    return ids, mask


def test_logits_equal_the_hf_models(hf_model, megatron_groups):
    ids, mask = padded_batch(hf_model.config.vocab_size)
    model = megatron_lm(hf_model)
    with torch.no_grad():
        want = hf_model(input_ids=ids, attention_mask=mask).logits
        got = model(input_ids=ids, attention_mask=mask).logits
        unpadded = model(input_ids=ids).logits
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], rtol=0, atol=1e-5)
    assert torch.isfinite(got).all()  # padding positions too: they are masked, not NaN
    torch.testing.assert_close(unpadded[0], want[0], rtol=0, atol=1e-5)


def test_a_wrong_qkv_layout_changes_the_logits(llama, megatron_groups):
    """The logits test can fail: q, k and v stacked whole instead of per group give other logits."""
    arch = arch_from_hf(llama.config)
    state = hf_to_megatron(llama.state_dict(), arch)
    for layer in range(arch.num_layers):
        attn = f"model.layers.{layer}.self_attn."
        stacked = torch.cat([llama.state_dict()[f"{attn}{p}_proj.weight"] for p in "qkv"])
        state[f"decoder.layers.{layer}.self_attention.linear_qkv.weight"] = stacked
    gpt = megatron_model.build_gpt_model(arch, torch.float32)
    megatron_model.load_megatron_state(gpt, state)
    ids, _ = padded_batch(VOCAB)
    with torch.no_grad():
        diff = megatron_model.MegatronCausalLM(gpt, VOCAB)(input_ids=ids).logits - llama(input_ids=ids).logits
    assert diff.abs().max() > 1e-3


def test_labels_give_the_hf_loss(llama, megatron_groups):
    ids, _ = padded_batch(VOCAB)
    labels = ids.clone()
    labels[:, :4] = -100
    with torch.no_grad():
        want = llama(input_ids=ids, labels=labels).loss
        got = megatron_lm(llama)(input_ids=ids, labels=labels).loss
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_a_bf16_model_is_bf16_throughout_as_megatrons_float16_module_makes_it(llama, megatron_groups):
    """megatron-core builds RMSNorm weights in float32 whatever `params_dtype` says (then its
    norms take a slow mixed-dtype path on CUDA, seen in the GPU lane); Megatron-LM's Float16Module
    casts them, so does `build_gpt_model`. The RoPE frequencies (a buffer) stay float32."""
    arch = arch_from_hf(llama.config)
    gpt = megatron_model.build_gpt_model(arch, torch.bfloat16)
    assert {param.dtype for param in gpt.parameters()} == {torch.bfloat16}
    assert gpt.decoder.layers[0].input_layernorm.weight.dtype == torch.bfloat16
    assert gpt.rotary_pos_emb.inv_freq.dtype == torch.float32
    hf16 = AutoModelForCausalLM.from_pretrained(llama.name_or_path, dtype=torch.bfloat16).eval()
    megatron_model.load_megatron_state(gpt, hf_to_megatron(hf16.state_dict(), arch))
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = hf16(input_ids=ids, labels=ids).loss
        got = megatron_model.MegatronCausalLM(gpt, arch.vocab_size).eval()(input_ids=ids, labels=ids).loss
    torch.testing.assert_close(got, want, rtol=0, atol=2e-2)  # bf16 rounding in different op orders


# ---- the strategy against the torch strategy ---------------------------------------------
def test_ppo_steps_match_the_torch_strategy(model_dir, megatron_groups):
    """Two PPO steps (2 epochs x 2 mini-batches x 2 micro-batches each, clipped): the same losses,
    gradient norms and final (HF-named) weights as the torch strategy."""
    assert_same_training(train_two_steps(model_dir, "megatron"), train_two_steps(model_dir, "torch"))


def _strategy(model_dir: str, name: str = "megatron", **config):
    return build_train_strategy(
        AutoModelForCausalLM.from_pretrained(model_dir),
        ARGS,
        strategy_name=name,
        strategy_config=config,
        total_steps=4,
        metric_prefix="actor",
    )


def test_checkpoint_is_an_hf_dir_and_resumes_the_optimizer(model_dir, tmp_path, megatron_groups):
    trained = _strategy(model_dir)
    trained.train_step(lm_minibatch(0), lm_loss())
    trained.step_lr_scheduler()
    trained.save_checkpoint(tmp_path)
    saved = AutoModelForCausalLM.from_pretrained(tmp_path).state_dict()
    for key, value in trained.state_dict().items():
        assert torch.equal(saved[key], value), key

    resumed = _strategy(model_dir)
    resumed.load_checkpoint(tmp_path)
    # the second step needs Adam's moments from the first: equal only if they were restored
    want, got = trained.train_step(lm_minibatch(1), lm_loss()), resumed.train_step(lm_minibatch(1), lm_loss())
    assert got["actor/grad_norm"] == pytest.approx(want["actor/grad_norm"], rel=1e-6)
    want_weights = trained.state_dict()
    for key, value in resumed.state_dict().items():
        torch.testing.assert_close(value, want_weights[key], rtol=0, atol=1e-6, msg=key)


def test_loaded_weights_are_the_ones_trained_next(model_dir, megatron_groups):
    """HF weights from another strategy load in, and the next step is the torch strategy's."""
    source = _strategy(model_dir, "torch")
    source.train_step(lm_minibatch(0), lm_loss())
    plain, loaded = _strategy(model_dir, "torch"), _strategy(model_dir)
    plain.load_state_dict(source.state_dict())
    loaded.load_state_dict(source.state_dict())
    want, got = plain.train_step(lm_minibatch(1), lm_loss()), loaded.train_step(lm_minibatch(1), lm_loss())
    assert got["actor/grad_norm"] == pytest.approx(want["actor/grad_norm"], rel=1e-5)
    want_weights = plain.state_dict()
    for key, value in loaded.state_dict().items():
        torch.testing.assert_close(value, want_weights[key], **WEIGHT_TOL, msg=key)


def test_non_finite_loss_skips_the_update(model_dir, megatron_groups):
    strategy = _strategy(model_dir)
    before = strategy.state_dict()
    metrics = strategy.train_step(lm_minibatch(0), lm_loss(float("nan")))
    assert metrics["actor/skipped_steps"] == 1
    for key, value in strategy.state_dict().items():
        assert torch.equal(value, before[key]), key


# ---- what the strategy refuses, in one line ------------------------------------------------
@pytest.mark.parametrize(
    "config, message",
    [
        (
            {"tensor_model_parallel_size": 2},
            "tensor_model_parallel_size: world_size 1 is not divisible by "
            "tensor_model_parallel_size \\* pipeline_model_parallel_size = 2",
        ),
        (
            {"pipeline_model_parallel_size": 2},
            "pipeline_model_parallel_size: world_size 1 is not divisible by "
            "tensor_model_parallel_size \\* pipeline_model_parallel_size = 2",
        ),
        ({"expert_model_parallel_size": 2}, "expert_model_parallel_size: expert parallel needs a MoE model"),
        ({"context_parallel_size": 2}, "context_parallel_size: context parallel is not built"),
        ({"sequence_parallel": True}, "sequence_parallel: sequence parallel is not built"),
        ({"recompute_granularity": "block"}, "recompute_granularity: 'block' is not one of full, selective, null"),
        ({"tensor_model_parallel_size": 0}, "tensor_model_parallel_size: must be an integer >= 1"),
    ],
)
def test_parallel_layouts_not_built_stop_at_start_naming_the_key(model_dir, megatron_groups, config, message):
    with pytest.raises(ValueError, match=f"^strategy_config.{message}"):
        _strategy(model_dir, **config)


def test_pipeline_parallel_is_accepted_and_its_layer_split_checked():
    """The old refusal is gone: 2 stages on 2 ranks pass the config check. Stages that cannot
    hold the layers evenly (more stages than layers, or not dividing them) stop with one line
    naming the key (the model's layers are known when it is built)."""
    from roll.distributed.strategies.megatron.parallel import check_parallel_config, check_pipeline_stages

    check_parallel_config(2, pipeline_model_parallel_size=2)
    check_parallel_config(8, tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    check_pipeline_stages(2, num_layers=4)
    for stages in (3, 4):
        with pytest.raises(
            ValueError,
            match=f"^strategy_config.pipeline_model_parallel_size: {stages} does not "
            "divide the model's 2 decoder layers",
        ):
            check_pipeline_stages(stages, num_layers=2)


def test_uneven_pipeline_stages_are_split_as_megatron_splits_them():
    """`num_layers_in_first/last_pipeline_stage` fix the ends, the rest is shared equally between;
    a split that cannot be made is one line naming the key."""
    from roll.distributed.strategies.megatron.parallel import check_pipeline_stages

    assert check_pipeline_stages(2, 4) == [2, 2]
    assert check_pipeline_stages(2, 3, first=1) == [1, 2]
    assert check_pipeline_stages(2, 3, last=1) == [2, 1]
    assert check_pipeline_stages(4, 10, first=2, last=2) == [2, 3, 3, 2]
    assert check_pipeline_stages(3, 7, first=1) == [1, 3, 3]
    bad = [
        (
            (2, 3),
            {"first": 1, "last": 1},
            "num_layers_in_first_pipeline_stage: the other 0 stage(s) cannot share the remaining 1 of 3",
        ),
        (
            (3, 6),
            {"last": 1},
            "num_layers_in_last_pipeline_stage: the other 2 stage(s) cannot share the remaining 5 of 6",
        ),
        (
            (2, 2),
            {"first": 2},
            "num_layers_in_first_pipeline_stage: the other 1 stage(s) cannot share the remaining 0 of 2",
        ),
        ((1, 2), {"first": 1}, "num_layers_in_first_pipeline_stage: needs pipeline_model_parallel_size >= 2"),
        ((2, 4), {"last": 0}, "num_layers_in_last_pipeline_stage: must be an integer >= 1 (got 0)"),
    ]
    for args, kwargs, message in bad:
        with pytest.raises(ValueError, match="^" + re.escape(f"strategy_config.{message}")):
            check_pipeline_stages(*args, **kwargs)


def test_pipeline_stages_by_hand(hf_model):
    """Stage 1 of 2 holds layer 1 as its layer 0, the final norm and the output layer (the
    embedding itself when tied); stage 0 the embedding and layer 0. `from_stage` names them back,
    and the stages together are the whole model (the tied copy once)."""
    from roll.distributed.strategies.megatron.convert import EMBEDDING, OUTPUT, from_stage, stage_state

    arch = arch_from_hf(hf_model.config)
    full = hf_to_megatron(hf_model.state_dict(), arch)
    first, last = (stage_state(full, arch, offset, 1, offset == 0, offset == 1) for offset in (0, 1))
    qkv = "decoder.layers.{}.self_attention.linear_qkv.weight"
    assert torch.equal(last[qkv.format(0)], full[qkv.format(1)]) and qkv.format(1) not in last
    assert EMBEDDING in first and EMBEDDING not in last and "decoder.final_layernorm.weight" in last
    assert torch.equal(last[OUTPUT], full[EMBEDDING] if arch.tied_embeddings else full[OUTPUT])
    assert not any(name.startswith("decoder.final") or name == OUTPUT for name in first)
    back = from_stage(first, 0, arch) | from_stage(last, 1, arch)
    assert back.keys() == full.keys() and all(torch.equal(back[k], v) for k, v in full.items())


def test_roll_example_keys_run(model_dir, megatron_groups):
    """ROLL's WebShop example's values: all 1, the distributed optimizer (same steps: every data-
    parallel rank holds the whole optimizer state here), full recomputation."""
    _strategy(
        model_dir,
        tensor_model_parallel_size=1,
        pipeline_model_parallel_size=1,
        expert_model_parallel_size=1,
        context_parallel_size=1,
        use_distributed_optimizer=True,
        recompute_granularity="full",
    )


@pytest.mark.parametrize("granularity", ["full", "selective"])
def test_recomputation_reruns_attention_and_changes_no_gradient(model_dir, megatron_groups, monkeypatch, granularity):
    """Attention runs twice per layer and training micro-batch (forward, then again in the
    backward) with either granularity, once without; the gradient norm is the plain run's."""
    plain, recomputing = _strategy(model_dir), _strategy(model_dir, recompute_granularity=granularity)
    sdpa, calls = torch.nn.functional.scaled_dot_product_attention, []
    monkeypatch.setattr(
        torch.nn.functional,
        "scaled_dot_product_attention",
        lambda *args, **kwargs: calls.append(1) or sdpa(*args, **kwargs),
    )
    want = plain.train_step(lm_minibatch(0), lm_loss())["actor/grad_norm"]
    micro_batches, layers = 2, 2  # ARGS: 4 rows, 2 per micro-batch; the tiny Llama's 2 layers
    assert len(calls) == micro_batches * layers
    got = recomputing.train_step(lm_minibatch(0), lm_loss())["actor/grad_norm"]
    assert got == pytest.approx(want, rel=1e-6)
    assert len(calls) == micro_batches * layers + 2 * micro_batches * layers


def test_tensor_parallel_clip_of_one_rank_is_torchs(megatron_groups):
    """With one rank the tensor-parallel clip is torch's clip_grad_norm_ (norm and clipped grads)."""
    from roll.distributed.strategies.megatron.parallel import clip_grad_norm_tensor_parallel_

    params = [torch.nn.Parameter(torch.zeros(3)) for _ in range(2)]
    copies = [torch.nn.Parameter(torch.zeros(3)) for _ in range(2)]
    for p, c, g in zip(params, copies, ([3.0, 0.0, 0.0], [0.0, 4.0, 0.0]), strict=True):
        p.grad, c.grad = torch.tensor(g), torch.tensor(g)
    norm = clip_grad_norm_tensor_parallel_([(params[0], True), (params[1], False)], 1.0, None)
    assert norm == pytest.approx(5.0) == float(torch.nn.utils.clip_grad_norm_(copies, 1.0))
    for p, c in zip(params, copies, strict=True):
        torch.testing.assert_close(p.grad, c.grad)


def test_a_value_model_is_refused(model_dir, megatron_groups):
    value_model = LlamaForTokenClassification.from_pretrained(model_dir, num_labels=1)
    with pytest.raises(ValueError, match="LlamaForTokenClassification .* needs torch, deepspeed or fsdp2"):
        build_train_strategy(value_model, ARGS, strategy_name="megatron", total_steps=1, metric_prefix="critic")


def test_a_missing_megatron_core_names_the_install_line(monkeypatch):
    import importlib.util

    from roll.configs.worker import _missing_requirement
    from roll.distributed.strategies.megatron.train import check_megatron_available

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    with pytest.raises(ImportError, match=r'needs megatron-core: pip install "megatron-core>=0.16,<0.17"'):
        check_megatron_available()
    assert _missing_requirement("megatron") == 'needs megatron-core: pip install "megatron-core>=0.16,<0.17"'
