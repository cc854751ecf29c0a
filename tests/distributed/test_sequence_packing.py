"""Sequence packing (roll.distributed.sequence_packing): packed rows give the padded numbers (log-probs,
entropies, values, gradients, whole PPO steps on torch / fsdp2 / deepspeed) up to float round-off,
and ROLL's load-balanced plans against partitions worked out by hand."""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp
from ppo_cases import ARGS, VOCAB, WEIGHT_TOL, assert_same_training, padded_and_packed, ppo_batch
from tensordict import TensorDict
from torch.testing import assert_close
from transformers import AutoModelForCausalLM

from roll.algorithms.actor_loss import PolicyLossOptions
from roll.configs.worker import TrainingArgs
from roll.distributed.micro_batches import shifted_values, token_logprobs
from roll.distributed.ranks import rank_share
from roll.distributed.sequence_packing import (
    PackedSequences,
    PackingBudget,
    balanced_partitions,
    balanced_rank_rows,
    workload,
)
from roll.distributed.strategies.process_group import free_port
from roll.distributed.strategies.registry import build_train_strategy
from roll.distributed.workers.actor import ActorWorker
from roll.distributed.workers.common import train_on_share
from roll.distributed.workers.reference import ReferenceWorker
from tests.conftest import tiny_llama

torch.set_num_threads(1)
LENGTHS = [9, 3, 6, 1, 7]  # right-padded to 9; one row of a single token


def ragged(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    mask = (torch.arange(9)[None, :] < torch.tensor(LENGTHS)[:, None]).long()
    ids = torch.randint(1, VOCAB, (len(LENGTHS), 9), generator=torch.Generator().manual_seed(seed))
    return ids * mask, mask


def test_packed_logprobs_entropies_and_gradients_equal_padded(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    ids, mask = ragged()
    (padded_lp, padded_h, padded_g), (packed_lp, packed_h, packed_g) = padded_and_packed(model, ids, mask)
    assert_close(packed_lp, padded_lp, rtol=1e-5, atol=1e-5)
    assert_close(packed_h, padded_h, rtol=1e-5, atol=1e-5)
    assert (packed_lp[mask == 0] == 0).all() and packed_lp[1, 1:3].ne(0).all()
    for name, grad in padded_g.items():
        assert_close(packed_g[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_packed_values_equal_padded():
    critic = tiny_llama(1, vocab_size=VOCAB, value_head=True)
    ids, mask = ragged(3)
    padded = shifted_values(critic, ids, mask)
    assert_close(shifted_values(PackedSequences(critic), ids, mask), padded, rtol=1e-5, atol=1e-5)


def packed_run(model_dir, name: str, config: dict | None, features: dict):
    actor = ActorWorker(
        model_dir, ARGS, total_train_steps=4, seed=7, num_threads=1, strategy_name=name, strategy_config=config or {},
        features=features,
    )  # fmt: skip
    metrics = [
        actor.train(ppo_batch(actor), PolicyLossOptions(entropy_coef=0.01), ppo_epochs=2, step=step)
        for step in range(2)
    ]  # fmt: skip
    return metrics, actor.get_weights()


@pytest.fixture(scope="module")
def padded_run(model_dir):
    return packed_run(model_dir, "torch", None, {})


ENGINES = {
    "torch": ("torch", None),
    "fsdp2": ("fsdp2", {}),
    "deepspeed": ("deepspeed", {"zero_optimization": {"stage": 2}}),
}


@pytest.mark.parametrize("engine", list(ENGINES))
def test_packed_ppo_steps_match_padded_ones(model_dir, padded_run, engine):
    """Two PPO steps (old log-probs from a packed forward, 2 epochs x 2 mini-batches x 2 packed
    micro-batches): the losses, gradient norms and weights of the padded torch run."""
    if engine == "deepspeed":
        pytest.importorskip("deepspeed")
    assert_same_training(packed_run(model_dir, *ENGINES[engine], {"sequence_packing": True}), padded_run)


def test_load_balanced_packed_micro_batches_match_padded_ones(model_dir, padded_run):
    plan = PackingBudget(max_tokens=12, min_micro_batches=1)  # 4 rows of 6..9 tokens: 3 micro-batches
    features = {"sequence_packing": True, "train_budget": plan, "infer_budget": plan}
    assert_same_training(packed_run(model_dir, "torch", None, features), padded_run)


def test_packed_reference_logprobs_equal_padded(model_dir):
    ids, mask = ragged(5)
    batch = ppo_batch(ActorWorker(model_dir, ARGS, total_train_steps=1, seed=7, num_threads=1))
    got = [
        ReferenceWorker(model_dir, micro_batch_size=3, sequence_packing=packed, num_threads=1).compute_logprobs(
            batch, 1.0
        )
        for packed in (False, True)
    ]
    assert_close(got[1], got[0], rtol=1e-5, atol=1e-5)


def test_karmarkar_karp_by_hand():
    # 8, 7, 6, 5, 4 into 2: differences 8-7 -> 1; 6-5 -> 1; 4-1 -> 3; 3-1 -> 2: {7, 5, 4} 16 / {8, 6} 14
    assert sorted(map(sorted, balanced_partitions([8, 7, 6, 5, 4], 2, equal_size=False))) == [[0, 2], [1, 3, 4]]
    # 1..6 in 2 sets of 3: pairs (1, 2), (3, 4), (5, 6) of spread 1 each; the first two merge
    # largest-with-smallest into {2, 3} {1, 4} (5 / 5), then with (5, 6): {6, 2, 3} 11 / {5, 1, 4} 10
    assert sorted(map(sorted, balanced_partitions([1, 2, 3, 4, 5, 6], 2, equal_size=True))) == [[0, 3, 4], [1, 2, 5]]


def test_load_balance_plan_by_hand():
    lengths = [10, 3, 9, 4, 7, 2]  # 35 tokens, max 20 -> ceil(35 / 20) = 2 micro-batches
    assert workload(10) == 245860
    # workloads order as the lengths: 10 | 9 -> 1; 7 | 4 -> 3; 3 | 2 -> 1 ... sums 17 and 18 tokens
    assert PackingBudget(max_tokens=20).bins(lengths) == [[0, 4], [1, 2, 3, 5]]
    assert len(PackingBudget(max_tokens=20, min_micro_batches=4).bins(lengths)) == 4
    assert len(PackingBudget(max_tokens=20, min_micro_batches=9).bins(lengths)) == 6  # at most one per row
    with pytest.raises(ValueError, match="max_packed"):
        PackingBudget(max_tokens=8).bins(lengths)


def test_mini_batch_rows_spread_over_ranks_by_workload():
    assert balanced_rank_rows([10, 3, 9, 4, 7, 2], 2) == [[0, 1, 3], [2, 4, 5]]  # 17 / 18 tokens, 3 rows each
    mask = (torch.arange(10)[None, :] < torch.tensor([10, 3, 9, 4, 7, 2])[:, None]).long()
    batch = {"attention_mask": mask, "response_mask": mask.float(), "row": torch.arange(6)}
    minibatch = TensorDict(batch, batch_size=[6])
    shares = [rank_share(minibatch, rank, 2, "tokens", balanced=True) for rank in (0, 1)]
    assert [share["row"].tolist() for share, _ in shares] == [[0, 1, 3], [2, 4, 5]]
    assert shares[0][1] == shares[1][1] == 35.0  # every rank weighs against the whole mini-batch


TWO_RANK_ARGS = TrainingArgs(learning_rate=1e-2, per_device_train_batch_size=2, max_grad_norm=0.5)


def ragged_minibatch() -> TensorDict:
    lengths = torch.tensor([10, 3, 9, 4, 7, 2])
    mask = (torch.arange(10)[None, :] < lengths[:, None]).long()
    ids = torch.randint(1, VOCAB, (6, 10), generator=torch.Generator().manual_seed(4)) * mask
    response = mask.float()
    response[:, 0] = 0
    return TensorDict({"input_ids": ids, "attention_mask": mask, "response_mask": response}, batch_size=[6])


def nll_loss(model, micro):
    logprobs, _ = token_logprobs(model, micro["input_ids"], micro["attention_mask"], 1.0)
    mask = micro["response_mask"]
    return -(logprobs * mask).sum() / mask.sum().clamp(min=1), {}


def _two_steps(strategy, share) -> tuple[list[float], dict]:
    norms = [share(strategy)["actor/grad_norm"] for _ in range(2)]
    return norms, strategy.state_dict()


def _packed_rank(rank: int, model_dir: str, port: int, out_dir: str) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    torch.manual_seed(0)
    plan = PackingBudget(max_tokens=12)
    strategy = build_train_strategy(
        AutoModelForCausalLM.from_pretrained(model_dir), TWO_RANK_ARGS, strategy_name="fsdp2", strategy_config={},
        total_steps=2, metric_prefix="actor", train_budget=plan, infer_budget=plan, sequence_packing=True,
    )  # fmt: skip
    assert strategy.balance_ranks and strategy.sequence_packing  # rank_share spreads rows by workload
    result = _two_steps(strategy, lambda s: train_on_share(s, ragged_minibatch(), nll_loss, "tokens"))
    if rank == 0:
        torch.save(result, os.path.join(out_dir, "packed.pt"))


def test_two_fsdp2_ranks_packed_and_load_balanced_train_like_one_padded_process(model_dir, tmp_path):
    """Rows spread over 2 ranks by workload ([10, 3, 4] / [9, 7, 2] tokens), packed micro-batches
    of ROLL's plan on each: the gradient norms and weights of one padded torch process."""
    mp.spawn(_packed_rank, args=(model_dir, free_port(), str(tmp_path)), nprocs=2, join=True)
    norms, weights = torch.load(tmp_path / "packed.pt", weights_only=True)
    torch.manual_seed(0)
    padded = build_train_strategy(
        AutoModelForCausalLM.from_pretrained(model_dir), TWO_RANK_ARGS, total_steps=2, metric_prefix="actor"
    )
    want_norms, want_weights = _two_steps(padded, lambda s: s.train_step(ragged_minibatch(), nll_loss))
    assert norms == pytest.approx(want_norms, rel=1e-4)
    for key, value in want_weights.items():
        assert_close(weights[key], value, **WEIGHT_TOL, msg=key)
