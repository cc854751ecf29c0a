"""Dynamic batching (roll.distributed.dynamic_batching): the binning by hand, and the same losses,
gradients and forward outputs as fixed micro-batches."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from transformers import AutoModelForCausalLM

from roll.distributed.dynamic_batching import TokenBudget, bin_by_tokens, pad_to_multiple, padding_fraction, row_lengths
from roll.distributed.micro_batches import all_rows, iter_distinct_micro_batches
from roll.distributed.strategies.registry import build_train_strategy
from tests.distributed.ppo_cases import ARGS, VOCAB


def test_bins_by_hand():
    # sorted: 9 (row 1), 7 (row 3), 5 (row 0), 3 (row 2), 2 (row 4); rounded to 4: 12, 8, 8, 4, 4
    lengths = [5, 9, 3, 7, 2]
    # budget 16: [1] (12; 2 x 12 > 16) | [3, 0] (2 x 8) | [2, 4] (2 x 4; a third row would fit, none is left)
    assert bin_by_tokens(lengths, TokenBudget(16, round_to=4)) == [[1], [3, 0], [2, 4]]
    # budget 24: [1, 3] (2 x 12) | [0, 2, 4] (3 x 8)
    assert bin_by_tokens(lengths, TokenBudget(24, round_to=4)) == [[1, 3], [0, 2, 4]]
    # equal lengths keep row order
    assert bin_by_tokens([4, 4, 4], TokenBudget(8)) == [[0, 1], [2]]
    bins = bin_by_tokens(lengths, TokenBudget(24, round_to=4))
    assert padding_fraction(lengths, bins, 4) == pytest.approx(1 - 26 / 48)


def test_a_row_longer_than_the_budget_names_the_key():
    with pytest.raises(ValueError, match=r"^max_tokens_per_microbatch_in_train: 8 is smaller than one sequence"):
        bin_by_tokens([5, 9], TokenBudget(8, round_to=1, key="max_tokens_per_microbatch_in_train"))


def test_pad_to_multiple_and_row_lengths():
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])
    assert row_lengths(mask) == [3, 2]
    micro = pad_to_multiple(TensorDict({"attention_mask": mask, "rows": torch.ones(2)}, batch_size=[2]), 4)
    assert micro["attention_mask"].shape == (2, 8) and micro["attention_mask"][:, 5:].sum() == 0


def _batch(n: int = 10) -> TensorDict:
    """Rows of 4..17 tokens (prompt 3), right-padded to 18: a spread like multi-turn samples."""
    generator = torch.Generator().manual_seed(3)
    lengths = torch.tensor([4 + (7 * i) % 14 for i in range(n)])[:, None]
    positions = torch.arange(18)
    mask = (positions < lengths).long()
    return TensorDict(
        {
            "input_ids": torch.randint(1, VOCAB, (n, 18), generator=generator) * mask,
            "attention_mask": mask,
            "response_mask": ((positions >= 3) & (positions < lengths)).float(),
            "advantages": torch.randn(n, 18, generator=generator),
        },
        batch_size=[n],
    )


def _loss(model, micro):
    """A token-mean policy-gradient-like loss: -mean(advantage * logprob) over response tokens."""
    from roll.distributed.micro_batches import token_logprobs

    logprobs, _ = token_logprobs(model, micro["input_ids"], micro["attention_mask"], 1.0)
    mask = micro["response_mask"]
    loss = -(logprobs * micro["advantages"] * mask).sum() / mask.sum().clamp(min=1)
    return loss, {"loss": loss.detach()}


def _strategy(model_dir, train_budget=None, infer_budget=None):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    return build_train_strategy(
        model, ARGS, total_steps=4, metric_prefix="actor", train_budget=train_budget, infer_budget=infer_budget
    )


def test_same_loss_gradients_and_logprobs_as_fixed_micro_batches(model_dir):
    torch.set_num_threads(1)
    fixed, dynamic = _strategy(model_dir), _strategy(model_dir, TokenBudget(40, 8), TokenBudget(40, 8))
    batch = _batch()
    grads = {}
    for name, strategy in (("fixed", fixed), ("dynamic", dynamic)):
        step = strategy._clip_and_step

        def capture(finite, strategy=strategy, step=step, name=name):
            grads[name] = {n: p.grad.clone() for n, p in strategy.model.named_parameters()}
            return step(finite)

        strategy._clip_and_step = capture
    rows = all_rows(10)
    shapes = [tuple(m["input_ids"].shape) for m in iter_distinct_micro_batches(batch, 2, rows, dynamic.train_budget)]
    assert all(rows * length <= 40 and length % 8 == 0 for rows, length in shapes)
    assert len(shapes) != 5  # not the fixed split into 5 micro-batches of 2 rows
    want = fixed.train_step(batch, _loss)
    got = dynamic.train_step(batch, _loss)
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-6)
    assert got["actor/grad_norm"] == pytest.approx(want["actor/grad_norm"], rel=1e-5)
    for name, grad in grads["fixed"].items():
        torch.testing.assert_close(grads["dynamic"][name], grad, rtol=1e-5, atol=1e-6)
    # forward passes (old log-probs): the same per-token outputs, back in batch order
    fixed_lp, _ = fixed.forward_logprobs(batch, 1.0)
    dynamic_lp, _ = dynamic.forward_logprobs(batch, 1.0)
    assert dynamic_lp.shape == fixed_lp.shape == (10, 18)
    torch.testing.assert_close(dynamic_lp, fixed_lp, rtol=1e-5, atol=1e-5)
