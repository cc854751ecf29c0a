"""The `megatron` strategy at pipeline parallel 2 over two CPU processes (gloo): stage 0 holds the
embedding and layer 0, stage 1 layer 1, the final norm and the output layer
(roll.distributed.strategies.megatron.pipeline). Checked against one process (PP 1):
- HF -> stages -> gathered HF weights, bit for bit, on both ranks and in the checkpoint dir;
- two PPO steps (ppo_cases) on the untied tiny Llama and on a tied-embedding one (whose gradient
  the first and last stage sum): the losses, gradient norms and merged weights of PP 1;
- log-probs of the forward-only path (`megatron_infer`'s use) equal PP 1's;
- a checkpoint saved at PP 2 (one optimizer file per stage) resumes: the next step is the step
  the saving strategy takes;
- recomputation (full, selective) changes no gradient norm at PP 2 (layers rerun inside a stage's
  backward, between its receive and send);
- LoRA on every linear (megatron_lora_tp_check's run, at PP 2 instead of TP 2): PP 1's losses,
  gradient norms, merged weights and parameter counts, the same adapter in the checkpoint, resume;
- an uneven split (3 layers, `num_layers_in_first_pipeline_stage: 1`): the layers each stage
  holds, HF weights back bit for bit, PP 1's two PPO steps.
The pure stage split (`stage_state` / `from_stage`) and the one-line refusals are in
test_megatron.py.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp
from ppo_cases import assert_same_training, lm_loss, lm_minibatch, ppo_batch, train_two_steps
from transformers import AutoModelForCausalLM

from roll.configs.worker import TrainingArgs
from roll.distributed.strategies.process_group import ensure_process_group, free_port
from roll.distributed.strategies.registry import build_train_strategy
from tests.conftest import save_tiny_llama
from tests.lanes.megatron_lora_tp_check import assert_same_lora_training
from tests.lanes.megatron_lora_tp_check import run as lora_run

pytest.importorskip("megatron.core", reason="needs megatron-core (the test extra installs it)")
ARGS = TrainingArgs(learning_rate=1e-2, per_device_train_batch_size=2, max_grad_norm=0.5)
PP2 = {"pipeline_model_parallel_size": 2}


UNEVEN = PP2 | {"num_layers_in_first_pipeline_stage": 1}


@pytest.fixture(scope="module")
def three_layer_dir(tmp_path_factory) -> str:
    """The `model_dir` Llama's shape with 3 decoder layers: 2 stages cannot share them equally."""
    return save_tiny_llama(tmp_path_factory.mktemp("llama3"), seed=5, num_hidden_layers=3)


@pytest.fixture(scope="module")
def tied_model_dir(tmp_path_factory) -> str:
    """The `model_dir` Llama's shape with tied input and output embeddings."""
    return save_tiny_llama(tmp_path_factory.mktemp("tied_llama"), seed=3, tie_word_embeddings=True)


def _strategy(model_dir: str, config: dict | None = None):
    return build_train_strategy(
        AutoModelForCausalLM.from_pretrained(model_dir),
        ARGS,
        strategy_name="megatron",
        strategy_config=config or {},
        total_steps=4,
        metric_prefix="actor",
    )


def _logprobs(model_dir: str, config: dict | None = None) -> tuple[torch.Tensor, dict]:
    """Log-probs of the PPO batch (forward only) and the untrained weights the actor hands out."""
    from roll.distributed.workers.actor import ActorWorker

    actor = ActorWorker(
        model_dir,
        ARGS,
        total_train_steps=4,
        seed=7,
        num_threads=1,
        strategy_name="megatron",
        strategy_config=config or {},
    )
    return ppo_batch(actor)["old_logprobs"], actor.get_weights()


def _resume(model_dir: str, directory: str, config: dict | None = None) -> dict:
    """One step, a checkpoint, a fresh strategy that loads it; both take the next step."""
    trained = _strategy(model_dir, config)
    trained.train_step(lm_minibatch(0), lm_loss())
    trained.step_lr_scheduler()
    trained.save_checkpoint(directory)
    resumed = _strategy(model_dir, config)
    resumed.load_checkpoint(directory)
    want, got = trained.train_step(lm_minibatch(1), lm_loss()), resumed.train_step(lm_minibatch(1), lm_loss())
    return {
        "norms": (want["actor/grad_norm"], got["actor/grad_norm"]),
        "weights": (trained.state_dict(), resumed.state_dict()),
    }


def _rank(rank: int, model_dir: str, tied_dir: str, three_dir: str, port: int, out_dir: str) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    ensure_process_group(torch.device("cpu"))
    strategy = _strategy(model_dir, PP2)
    layout = (
        strategy.pipeline.stage,
        strategy.layer_offset,
        len(strategy.gpt.decoder.layers),
        strategy.tp_rank,
        strategy.dp_rank,
        strategy.dp_size,
    )
    untrained = strategy.state_dict()
    strategy.save_checkpoint(os.path.join(out_dir, "untrained"))
    del strategy
    results = {
        "layout": layout,
        "untrained": untrained,
        "logprobs": _logprobs(tied_dir, PP2),
        "ppo": train_two_steps(model_dir, "megatron", PP2),
        "tied_ppo": train_two_steps(tied_dir, "megatron", PP2),
        "resume": _resume(model_dir, os.path.join(out_dir, "resume"), PP2),
        "lora": lora_run(model_dir, PP2, os.path.join(out_dir, "lora")),
        "recompute": [
            _strategy(model_dir, PP2 | {"recompute_granularity": granularity}).train_step(lm_minibatch(0), lm_loss())[
                "actor/grad_norm"
            ]
            for granularity in (None, "full", "selective")
        ],
    }
    uneven = _strategy(three_dir, UNEVEN)
    results["uneven"] = {
        "layout": (uneven.pipeline.stage, uneven.layer_offset, len(uneven.gpt.decoder.layers)),
        "untrained": uneven.state_dict(),
        "ppo": train_two_steps(three_dir, "megatron", UNEVEN),
    }
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))


@pytest.fixture(scope="module")
def two_stages(model_dir, tied_model_dir, three_layer_dir, tmp_path_factory) -> list:
    out_dir = tmp_path_factory.mktemp("megatron_stages")
    mp.spawn(_rank, args=(model_dir, tied_model_dir, three_layer_dir, free_port(), str(out_dir)), nprocs=2, join=True)
    return [torch.load(out_dir / f"rank{rank}.pt", weights_only=True) for rank in range(2)] + [out_dir]


@pytest.fixture(scope="module")
def one_stage():
    """The PP-1 runs compare against: megatron in this process (world size 1)."""
    from roll.distributed.strategies.megatron import model as megatron_model

    ensure_process_group(torch.device("cpu"))
    megatron_model.init_model_parallel()


def test_stages_hold_their_share_of_the_layers(two_stages):
    # (stage, first layer, layers, tp rank, dp rank, dp size): megatron's order puts stages outermost
    assert [result["layout"] for result in two_stages[:2]] == [(0, 0, 1, 0, 0, 1), (1, 1, 1, 0, 0, 1)]


def test_uneven_stages_hold_their_layers_and_train_like_one_stage(three_layer_dir, two_stages, one_stage):
    """3 layers, `num_layers_in_first_pipeline_stage: 1`: stage 0 layer 0, stage 1 layers 1-2; the
    gathered weights are the HF model's, bit for bit, and two PPO steps are PP 1's."""
    assert [r["uneven"]["layout"] for r in two_stages[:2]] == [(0, 0, 1), (1, 1, 2)]
    want = AutoModelForCausalLM.from_pretrained(three_layer_dir).state_dict()
    for result in two_stages[:2]:
        got = result["uneven"]["untrained"]
        assert list(got) == list(want) and all(torch.equal(got[k], v) for k, v in want.items())
    reference = train_two_steps(three_layer_dir, "megatron")
    for result in two_stages[:2]:
        assert_same_training(result["uneven"]["ppo"], reference)


def test_round_trip_gives_back_the_hf_weights_exactly(model_dir, tied_model_dir, two_stages):
    """Untied: from both ranks and the checkpoint dir rank 0 wrote; tied: the embedding comes
    from stage 0 and stands for lm_head too (stage 1's copy is not sent)."""
    want = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    saved = AutoModelForCausalLM.from_pretrained(two_stages[2] / "untrained").state_dict()
    want_tied = AutoModelForCausalLM.from_pretrained(tied_model_dir).state_dict()
    pairs = [(got, want) for got in (two_stages[0]["untrained"], two_stages[1]["untrained"], saved)]
    pairs += [(result["logprobs"][1], want_tied) for result in two_stages[:2]]
    for got, wanted in pairs:
        assert list(got) == list(wanted)
        for key, value in wanted.items():
            assert torch.equal(got[key], value), key
    assert sorted(p.name for p in (two_stages[2] / "untrained").glob("optimizer*.pt")) == [
        "optimizer-tp0-pp0.pt",
        "optimizer-tp0-pp1.pt",
    ]


def test_ppo_steps_equal_one_stage(model_dir, two_stages, one_stage):
    want = train_two_steps(model_dir, "megatron")
    for result in two_stages[:2]:
        assert_same_training(result["ppo"], want)


def test_tied_embeddings_train_like_one_stage(tied_model_dir, two_stages, one_stage):
    """The embedding (stage 0) and the output layer (stage 1) are one weight: its gradient is the
    sum of both stages' parts, so both copies take PP 1's step and leave as one `lm_head`."""
    want = train_two_steps(tied_model_dir, "megatron")
    for result in two_stages[:2]:
        assert_same_training(result["tied_ppo"], want)
        weights = result["tied_ppo"][1]
        assert torch.equal(weights["lm_head.weight"], weights["model.embed_tokens.weight"])


def test_forward_only_log_probs_equal_one_stage(tied_model_dir, two_stages, one_stage):
    want, _ = _logprobs(tied_model_dir)
    for result in two_stages[:2]:
        torch.testing.assert_close(result["logprobs"][0], want, rtol=0, atol=1e-5)


def test_checkpoint_resumes_at_two_stages(two_stages):
    """The step after loading needs Adam's moments of both stages: equal only if each stage's
    optimizer file was restored (weights to float round-off, as in test_megatron.py)."""
    assert sorted(p.name for p in (two_stages[2] / "resume").glob("optimizer*.pt")) == [
        "optimizer-tp0-pp0.pt",
        "optimizer-tp0-pp1.pt",
    ]
    for result in two_stages[:2]:
        want_norm, got_norm = result["resume"]["norms"]
        assert got_norm == pytest.approx(want_norm, rel=1e-6)
        want, got = result["resume"]["weights"]
        for key, value in want.items():
            torch.testing.assert_close(got[key], value, rtol=0, atol=1e-6, msg=key)


def test_lora_trains_like_one_stage(model_dir, two_stages, one_stage, tmp_path):
    """Stage 1 draws its adapters after stage 0's layer (as one stage draws them in order), so both
    start from PP 1's adapters; the saved adapter is gathered from both stages."""
    want = lora_run(model_dir, {}, str(tmp_path / "lora"))
    assert_same_lora_training(
        [result["lora"] for result in two_stages[:2]], want, str(two_stages[2] / "lora"), str(tmp_path / "lora")
    )


def test_recomputation_changes_no_gradient_at_two_stages(two_stages):
    for result in two_stages[:2]:
        plain, full, selective = result["recompute"]
        assert plain > 0.5  # clipping active
        assert full == pytest.approx(plain, rel=1e-6) and selective == pytest.approx(plain, rel=1e-6)
