"""The actor taking PPO's old log-probs in its training call (roll.distributed.workers.old_logprobs):
it trains as with the score phase's pass (every engine and batching feature), runs no pass for a
one-mini-batch step and one over the other rows otherwise, notes only response tokens, and an
engine that cannot take them refuses. Two ranks: test_rank_group.py."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from ppo_cases import assert_same_training, make_actor, ppo_batch
from tensordict import TensorDict

from roll.algorithms.actor_loss import PolicyLossOptions
from roll.algorithms.utils import masked_mean
from roll.distributed.dynamic_batching import TokenBudget
from roll.distributed.workers.actor import ActorWorker
from roll.distributed.workers.common import minibatch_rows
from roll.distributed.workers.old_logprobs import ROW_INDEX, OldLogprobs

LOSS = PolicyLossOptions(entropy_coef=0.01)


def three_steps(model_dir, old: bool, taken: list | None = None, engine: tuple = ("torch",)) -> tuple[list[dict], dict]:
    """Steps of 8, 8 and 7 rows, 2 epochs of mini-batches of 4 (so 3-4 rows outside the first);
    `engine`: `new_actor`'s name, config and features."""
    actor = make_actor(model_dir, *engine)
    metrics = []
    for step, n in enumerate((8, 8, 7)):
        batch = ppo_batch(actor, n, old=old)
        if taken is not None:
            taken.append((actor.compute_logprobs(batch, 1.0), batch))
        metrics.append(actor.train(batch, LOSS, ppo_epochs=2, step=step))
    return metrics, actor.get_weights()


def test_taken_old_logprobs_train_like_a_pass_of_their_own(model_dir, monkeypatch):
    tensors = []
    original = OldLogprobs.tensor
    monkeypatch.setattr(OldLogprobs, "tensor", lambda self: tensors.append(original(self)) or tensors[-1])
    before = []
    got = three_steps(model_dir, old=False, taken=before)

    assert_same_training(got, three_steps(model_dir, old=True))
    assert len(tensors) == 3  # one per training call
    for (want, batch), taken in zip(before, tensors, strict=True):
        torch.testing.assert_close(taken, want, rtol=0, atol=1e-6)
        assert torch.all(taken[batch["response_mask"] == 0] == 0)
    for metrics in got[0]:  # the engine's log-probs are the actor's +-0.01 at each response token
        assert metrics["rollout/logprob_abs_diff"] == pytest.approx(0.01, abs=1e-6)


BUDGET = TokenBudget(40, round_to=8)  # micro-batches padded to 16 columns, past the batch's 10
ENGINES = {
    "dynamic_batching": ("torch", None, {"train_budget": BUDGET, "infer_budget": BUDGET}),
    "sequence_packing": ("torch", None, {"sequence_packing": True}),
    "lora": ("torch", None, {"lora": {"rank": 4, "alpha": 8, "target": "all-linear"}}),
    "gradient_checkpointing": ("torch", None, {"gradient_checkpointing": True}),
    "deepspeed-zero3": ("deepspeed", {"zero_optimization": {"stage": 3}}, None),
    "fsdp2": ("fsdp2", {}, None),
}


@pytest.mark.parametrize("engine", list(ENGINES))
def test_every_engine_and_feature_trains_alike_either_way(model_dir, engine):
    if ENGINES[engine][0] == "deepspeed":
        pytest.importorskip("deepspeed")
    got = three_steps(model_dir, old=False, engine=ENGINES[engine])
    assert_same_training(got, three_steps(model_dir, old=True, engine=ENGINES[engine]))
    assert all(m["rollout/logprob_abs_diff"] == pytest.approx(0.01, abs=1e-6) for m in got[0])


def test_an_engine_that_cannot_take_them_refuses_a_batch_without_them(model_dir):
    pytest.importorskip("megatron.core", reason="needs megatron-core (the test extra installs it)")
    from roll.distributed.strategies.megatron.train import MegatronTrainStrategy

    assert MegatronTrainStrategy.takes_old_logprobs is False
    worker = make_actor(model_dir)
    worker.strategy.takes_old_logprobs = False  # as megatron's
    with pytest.raises(ValueError, match="needs the batch's old_logprobs"):
        worker.train(ppo_batch(worker, 4, old=False), LOSS, ppo_epochs=1, step=0)


def _count_passes(worker: ActorWorker, monkeypatch) -> list[int]:
    rows = []
    original = worker.strategy.forward_logprobs

    def counted(batch, *args, **kwargs):
        rows.append(batch.batch_size[0])
        return original(batch, *args, **kwargs)

    monkeypatch.setattr(worker.strategy, "forward_logprobs", counted)
    return rows


def test_a_step_of_one_minibatch_runs_no_pass_and_sees_ratio_one(model_dir, monkeypatch):
    worker = make_actor(model_dir)
    batch = ppo_batch(worker, 4, old=False)  # ARGS: mini-batches of 4 rows
    passes = _count_passes(worker, monkeypatch)

    metrics = worker.train(batch, replace(LOSS, entropy_coef=0.0), ppo_epochs=1, step=0)

    assert passes == []
    mask = batch["response_mask"]  # ratio exactly 1: the loss is -token-mean(A), nothing clipped
    assert metrics["losses/policy_loss"] == pytest.approx(-float(masked_mean(batch["advantages"], mask)), rel=1e-6)
    assert metrics["losses/approx_kl"] == 0.0 and metrics["losses/clipfrac"] == 0.0


def test_more_minibatches_score_only_the_rows_outside_the_first(model_dir, monkeypatch):
    worker = make_actor(model_dir)
    batch = ppo_batch(worker, 11, old=False)  # mini-batches of 4, 4 and 3 rows
    passes = _count_passes(worker, monkeypatch)

    worker.train(batch, LOSS, ppo_epochs=3, step=0)

    assert passes == [7]  # once per call, before the first optimizer step
    assert "old_logprobs" not in batch.keys()  # the caller's batch is left as it was


def test_copies_of_rows_share_the_first_steps_forward(model_dir):
    """With deduplication, rows with equal ids share one forward; a copy inside the first
    mini-batch and one outside it both get the row's old log-probs."""
    worker = make_actor(model_dir)
    half = ppo_batch(worker, 4, old=True)
    batch = torch.cat([half, half])  # rows 4..7 repeat rows 0..3
    first = set(next(minibatch_rows(8, 4, 7, "minibatch", 0, 0)).tolist())
    assert any((row in first) != (row + 4 in first) for row in range(4))  # a copy on each side
    given = worker.train(batch.clone(), LOSS, ppo_epochs=2, step=0)
    taking = make_actor(model_dir)
    without = batch.exclude("old_logprobs")
    without["infer_logprobs"] = batch["old_logprobs"]
    taken = taking.train(without, LOSS, ppo_epochs=2, step=0)
    for key in ("losses/policy_loss", "losses/approx_kl", "actor/grad_norm"):
        assert taken[key] == pytest.approx(given[key], rel=1e-4, abs=1e-7), key
    assert taken["rollout/logprob_abs_diff"] == pytest.approx(0.0, abs=1e-6)


def test_a_stand_in_row_notes_nothing():
    """A rank pads its micro-batches with copies whose response mask is 0 (`without_responses`):
    those must not overwrite the real row's old log-probs with the zeros they score."""
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 0.0, 1.0]])
    batch = TensorDict({"response_mask": mask}, batch_size=[2])
    strategy = SimpleNamespace(dp_size=1, dp_rank=0)
    old = OldLogprobs(batch, torch.tensor([0, 1]), strategy, 1.0)
    micro = TensorDict({"response_mask": mask, ROW_INDEX: torch.tensor([0, 1])}, batch_size=[2])
    logprobs = torch.tensor([[0.0, -1.0, -2.0], [0.0, 0.0, -3.0]], requires_grad=True)

    assert not old.take(micro, logprobs).requires_grad
    stand_in = TensorDict({"response_mask": torch.zeros(1, 3), ROW_INDEX: torch.tensor([0])}, batch_size=[1])
    old.take(stand_in, torch.zeros(1, 3))

    torch.testing.assert_close(old.tensor(), logprobs.detach())


def test_a_rank_scores_its_slice_of_the_other_rows_and_sums_over_ranks():
    """Two ranks, rows 0-1 the first mini-batch, rows 2-4 the others: rank 0 scores rows 2-3, rank
    1 row 4; each notes its share of the first mini-batch, so the ranks' parts hold every row once
    and their sum is the whole."""
    width = 2
    batch = TensorDict(
        {
            "input_ids": torch.arange(10).reshape(5, width),
            "attention_mask": torch.ones(5, width, dtype=torch.long),
            "response_mask": torch.ones(5, width),
        },
        batch_size=[5],
    )

    def value(rows: torch.Tensor) -> torch.Tensor:  # row r's log-probs: -(r + 1) at each token
        return -(rows.float()[:, None] + 1).expand(len(rows), width)

    scored, parts = [], []
    for rank in range(2):

        def forward_logprobs(inputs, temperature):
            scored.append((inputs["input_ids"][:, 0] // width).tolist())
            return value(torch.tensor(scored[-1])), None

        strategy = SimpleNamespace(
            dp_size=2, dp_rank=rank, forward_logprobs=forward_logprobs, sum_over_ranks=lambda t: parts.append(t) or t
        )
        old = OldLogprobs(batch, torch.tensor([0, 1]), strategy, 1.0)
        old.score_others()
        share = torch.tensor([rank])  # rank r trains row r of the first mini-batch
        old.take(TensorDict({"response_mask": torch.ones(1, width), ROW_INDEX: share}, batch_size=[1]), value(share))
        old.tensor()

    assert scored == [[2, 3], [4]]
    written = [(part != 0).all(dim=1) for part in parts]
    assert written[0].tolist() == [True, False, True, True, False]
    assert written[1].tolist() == [False, True, False, False, True]
    torch.testing.assert_close(parts[0] + parts[1], value(torch.arange(5)))
