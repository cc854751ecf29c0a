"""The `megatron` strategy's model with two ranks (two processes, gloo on CPU), checking what one
process cannot:
- tensor parallel 2: each rank loads its shard of the converted weights into a TP-2 `GPTModel`;
  logits (gathered over the ranks) equal the HF model's, and every parameter's gradient is the
  rank's shard of the HF gradient, converted and split like the weights;
- data parallel 2: each rank trains on its half of a mini-batch, and the weights after two
  optimizer steps are those of one process training on the whole mini-batch with the torch strategy.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp
from ppo_cases import assert_same_training, lm_loss, lm_minibatch, train_two_steps
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from roll.configs.worker import TrainingArgs
from roll.distributed.strategies.megatron.convert import arch_from_hf, hf_to_megatron, split_tensor_parallel
from roll.distributed.strategies.process_group import ensure_process_group, free_port
from roll.distributed.strategies.registry import build_train_strategy

pytest.importorskip("megatron.core", reason="needs megatron-core (the test extra installs it)")
ARGS = TrainingArgs(learning_rate=1e-2, per_device_train_batch_size=1, max_grad_norm=0.5)
TP2 = {"tensor_model_parallel_size": 2}


def qwen2() -> Qwen2ForCausalLM:
    """Qwen2 with q/k/v biases, tied embeddings and a vocabulary (31) that TP 2 pads to 32; biases
    and norms random too (HF initialises them to 0 and 1)."""
    torch.manual_seed(1)
    config = Qwen2Config(
        vocab_size=31,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.1)
    return model


def padded_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids and mask (a right-padded row) and the weights of the test's loss, sum(logits * w)."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 31, (2, 7), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    return ids, mask, torch.randn(2, 7, 31, generator=generator) * mask[..., None]


def _tensor_parallel_rank(rank: int) -> dict:
    from roll.distributed.strategies.megatron import model as megatron_model

    megatron_model.init_model_parallel(tensor_parallel=2)
    hf = qwen2()
    arch = arch_from_hf(hf.config)
    gpt = megatron_model.build_gpt_model(arch, torch.float32, tensor_parallel=2)
    full = hf_to_megatron(hf.state_dict(), arch, megatron_model.padded_vocab_size(arch, 2))
    megatron_model.load_megatron_state(gpt, split_tensor_parallel(full, arch, 2)[rank])
    ids, mask, weights = padded_batch()
    logits = megatron_model.MegatronCausalLM(gpt, arch.vocab_size)(input_ids=ids, attention_mask=mask).logits
    (logits * weights).sum().backward()
    grads = {name: param.grad for name, param in gpt.named_parameters()}
    megatron_model.parallel_state.destroy_model_parallel()
    return {"logits": logits.detach(), "grads": grads}


def _train(model_dir: str, name: str, args: TrainingArgs, rows: slice):
    strategy = build_train_strategy(
        AutoModelForCausalLM.from_pretrained(model_dir), args, strategy_name=name, total_steps=2, metric_prefix="actor"
    )
    norms = [strategy.train_step(lm_minibatch(seed)[rows], lm_loss())["actor/grad_norm"] for seed in (0, 1)]
    return norms, strategy.state_dict()


def _tensor_parallel_training(model_dir: str, out_dir: str) -> dict:
    """The strategy at TP 2: its weights before training (HF -> shards -> gathered HF), the
    checkpoint it writes untrained, then two PPO steps (the ppo_cases run, gathered weights)."""
    from roll.distributed.strategies.megatron import model as megatron_model

    megatron_model.parallel_state.destroy_model_parallel()  # the data-parallel layout of _train
    strategy = build_train_strategy(
        AutoModelForCausalLM.from_pretrained(model_dir),
        ARGS,
        strategy_name="megatron",
        strategy_config=TP2,
        total_steps=2,
        metric_prefix="actor",
    )
    layout = (strategy.tp_rank, strategy.tp_size, strategy.dp_rank, strategy.dp_size)
    untrained = strategy.state_dict()
    strategy.save_checkpoint(os.path.join(out_dir, "untrained"))
    del strategy
    return {"layout": layout, "untrained": untrained, "ppo": train_two_steps(model_dir, "megatron", TP2)}


def _rank(rank: int, model_dir: str, port: int, out_dir: str) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    ensure_process_group(torch.device("cpu"))
    results = {
        "tp": _tensor_parallel_rank(rank),
        "dp": _train(model_dir, "megatron", ARGS, slice(2 * rank, 2 * rank + 2)),
        "tp_train": _tensor_parallel_training(model_dir, out_dir),
    }
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))


@pytest.fixture(scope="module")
def two_ranks(model_dir, tmp_path_factory) -> list[dict]:
    out_dir = tmp_path_factory.mktemp("megatron_ranks")
    mp.spawn(_rank, args=(model_dir, free_port(), str(out_dir)), nprocs=2, join=True)
    return [torch.load(out_dir / f"rank{rank}.pt", weights_only=True) for rank in range(2)] + [out_dir]


def test_tensor_parallel_logits_and_gradients_are_the_hf_models(two_ranks):
    hf = qwen2()
    arch = arch_from_hf(hf.config)
    ids, mask, weights = padded_batch()
    logits = hf(input_ids=ids, attention_mask=mask).logits
    (logits * weights).sum().backward()
    real = mask.bool()
    hf_grads = {name: param.grad for name, param in hf.named_parameters()}  # tied: embed_tokens only
    want_grads = split_tensor_parallel(hf_to_megatron(hf_grads, arch, padded_vocab_size=32), arch, 2)
    for rank, result in enumerate(two_ranks[:2]):
        torch.testing.assert_close(result["tp"]["logits"][real], logits.detach()[real], rtol=0, atol=1e-5)
        got = result["tp"]["grads"]
        assert got.keys() == want_grads[rank].keys()
        for name, grad in want_grads[rank].items():
            torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-5, msg=f"rank {rank} {name}")


def test_data_parallel_ranks_train_like_one_process_on_the_whole_batch(model_dir, two_ranks):
    one_process = TrainingArgs(learning_rate=1e-2, per_device_train_batch_size=2, max_grad_norm=0.5)
    want_norms, want_weights = _train(model_dir, "torch", one_process, slice(0, 4))
    assert want_norms[0] > 0.5  # clipping is active, so the global norm matters
    for rank, result in enumerate(two_ranks[:2]):
        norms, weights = result["dp"]
        assert norms == pytest.approx(want_norms, rel=1e-4), rank
        for key, value in want_weights.items():
            torch.testing.assert_close(weights[key], value, rtol=1e-4, atol=1e-4, msg=f"rank {rank} {key}")


# ---- tensor parallel 2 in training -------------------------------------------------------------
def test_tensor_parallel_ranks_form_one_data_parallel_rank(two_ranks):
    assert [result["tp_train"]["layout"] for result in two_ranks[:2]] == [(0, 2, 0, 1), (1, 2, 0, 1)]


def test_tensor_parallel_round_trip_gives_back_the_hf_weights_exactly(model_dir, two_ranks):
    """HF -> Megatron shards -> gathered -> HF without training: bit for bit, on both ranks and in
    the checkpoint dir that rank 0 wrote (a plain HF dir)."""
    want = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    saved = AutoModelForCausalLM.from_pretrained(two_ranks[2] / "untrained").state_dict()
    for got in (two_ranks[0]["tp_train"]["untrained"], two_ranks[1]["tp_train"]["untrained"], saved):
        assert list(got) == list(want)
        for key, value in want.items():
            assert torch.equal(got[key], value), key
    assert sorted(p.name for p in (two_ranks[2] / "untrained").glob("optimizer*.pt")) == [
        "optimizer-tp0.pt",
        "optimizer-tp1.pt",
    ]


def test_tensor_parallel_ppo_steps_equal_one_process(model_dir, two_ranks):
    """Two PPO steps at TP 2 (both ranks on the same rows): the losses, gradient norms (over the
    whole gradient, shards and replicated norms) and merged weights of TP 1 in one process."""
    from roll.distributed.strategies.megatron import model as megatron_model
    from roll.distributed.strategies.process_group import ensure_process_group

    ensure_process_group(torch.device("cpu"))
    megatron_model.init_model_parallel()
    want = train_two_steps(model_dir, "megatron")
    for result in two_ranks[:2]:
        assert_same_training(result["tp_train"]["ppo"], want)
