"""Forward passes over distinct rows only: same outputs, same gradients, same updates (CPU, no Ray).

Distinct rows are rows up to their last real token, which is only ever a label: rows that differ
only there share one forward pass and each reads its own label's log-prob from it.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from roll.algorithms.actor_loss import PolicyLossOptions
from roll.algorithms.losses import ppo_policy_loss, value_loss
from roll.configs.worker import TrainingArgs
from roll.core.seeding import derive_seed
from roll.distributed import micro_batches
from roll.distributed.micro_batches import (
    all_rows,
    distinct_rows,
    forward_in_micro_batches,
    iter_distinct_micro_batches,
    iter_micro_batches,
    shifted_values,
    token_logprobs,
)
from roll.distributed.workers.actor import ActorWorker
from roll.distributed.workers.critic import CriticWorker
from tests.conftest import tiny_llama

torch.set_num_threads(1)
VOCAB = 32
# Eight rows, four distinct. Rows 2, 3 and 6 share row 0's forward pass: row 2 is a copy, row 3 has
# other ids under its padding, row 6 ends in another last token (5, not 7). Row 4 is row 1 with
# another last token (9, not 2). Row 5 has row 0's tokens but attends one more position (a real
# token 0) and row 7 differs from row 0 in a middle token: their own distinct rows. A whole-row key
# would have made rows 4 and 6 distinct too (6 of 8).
IDS = torch.tensor(
    [
        [3, 9, 4, 7, 0, 0],
        [5, 2, 8, 1, 6, 2],
        [3, 9, 4, 7, 0, 0],
        [3, 9, 4, 7, 11, 12],
        [5, 2, 8, 1, 6, 9],
        [3, 9, 4, 7, 0, 0],
        [3, 9, 4, 5, 0, 0],
        [3, 9, 2, 7, 0, 0],
    ]
)
LENGTHS = [4, 6, 4, 4, 6, 5, 4, 4]
MASK = (torch.arange(6) < torch.tensor(LENGTHS)[:, None]).long()
ROWS = len(LENGTHS)


def tiny_value_model(seed: int = 0):
    return tiny_llama(seed, value_head=True)


def capture_grads(strategy) -> list[list[torch.Tensor]]:
    """Gradients as the optimizer sees them, one list per optimizer step."""
    captured: list[list[torch.Tensor]] = []
    strategy.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: captured.append([p.grad.clone() for p in strategy.model.parameters()])
    )
    return captured


def rows_seen_by(model) -> list[int]:
    """Rows of every forward pass of `model`, appended as they happen."""
    seen: list[int] = []
    model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    return seen


# ---- grouping -------------------------------------------------------------------------------
def test_distinct_rows_compare_attended_tokens_before_the_last():
    rows = distinct_rows(IDS, MASK)
    # Keys (padding -1, last real token -2), numbered by their first row:
    # row 0 [3,9,4,-2,-1,-1], row 1 [5,2,8,1,6,-2], row 5 [3,9,4,7,-2,-1], row 7 [3,9,2,-2,-1,-1].
    assert rows.index.tolist() == [0, 1, 5, 7]
    assert rows.inverse.tolist() == [0, 1, 0, 0, 1, 2, 0, 3]
    assert rows.ratio == 4 / 8
    expanded = rows.expand(torch.tensor([10.0, 20.0, 30.0, 40.0]))
    assert expanded.tolist() == [10, 20, 10, 10, 20, 30, 10, 40]
    assert all_rows(6).index.tolist() == all_rows(6).inverse.tolist() == list(range(6))


def test_rows_sharing_a_hash_are_still_grouped_exactly(monkeypatch):
    hashed = distinct_rows(IDS, MASK)
    monkeypatch.setattr(micro_batches, "_row_hashes", lambda key: torch.zeros(len(key), dtype=torch.long))
    colliding = distinct_rows(IDS, MASK)  # every row the same hash: the exact comparison decides
    assert colliding.index.tolist() == hashed.index.tolist() == [0, 1, 5, 7]
    assert colliding.inverse.tolist() == hashed.inverse.tolist()
    assert distinct_rows(IDS[:0], MASK[:0]).index.tolist() == []


@pytest.mark.parametrize(
    ("other_ids", "other_length", "shared"),
    [
        ([1, 2, 3, 9], 4, True),  # only the last real token differs
        ([1, 2, 3, 4], 4, True),  # the same row
        ([1, 2, 3, 0], 3, False),  # a prefix of the row: the last token of one is real in the other
        ([1, 5, 3, 4], 4, False),  # a token before the last differs
        ([9, 2, 3, 4], 4, False),  # the first token differs
    ],
)
def test_rows_share_a_forward_pass_only_when_they_differ_at_most_in_the_last_token(other_ids, other_length, shared):
    ids = torch.tensor([[1, 2, 3, 4], other_ids])
    mask = (torch.arange(4) < torch.tensor([4, other_length])[:, None]).long()
    assert (len(distinct_rows(ids, mask).index) == 1) == shared


def test_distinct_micro_batches_hold_every_row_of_their_distinct_rows():
    columns = {"input_ids": IDS, "attention_mask": MASK, "row": torch.arange(ROWS)}
    batch = TensorDict(columns, batch_size=[ROWS])
    rows = distinct_rows(IDS, MASK)

    micros = list(iter_distinct_micro_batches(batch, 2, rows))

    # distinct rows {0, 1} are rows 0 and 1 (with 2, 3, 6 and 4); {2, 3} are rows 5 and 7
    assert [m["row"].tolist() for m in micros] == [[0, 1, 2, 3, 4, 6], [5, 7]]
    assert [m["input_ids"].shape[1] for m in micros] == [6, 5]  # each trimmed to its padding
    plain = [m["row"].tolist() for m in iter_micro_batches(batch, 4)]
    assert [m["row"].tolist() for m in iter_distinct_micro_batches(batch, 4, all_rows(ROWS))] == plain


# ---- outputs --------------------------------------------------------------------------------
def test_logprobs_entropy_and_values_equal_those_of_each_row_alone():
    policy, critic = tiny_llama(), tiny_value_model()
    policy_rows, critic_rows = rows_seen_by(policy), rows_seen_by(critic)
    with torch.no_grad():
        logprobs, entropy = token_logprobs(policy, IDS, MASK, temperature=0.7, with_entropy=True)
        values = shifted_values(critic, IDS, MASK)
        assert policy_rows == critic_rows == [4]  # one pass over the four distinct rows
        for b, length in enumerate(LENGTHS):
            ids, mask = IDS[b : b + 1, :length], MASK[b : b + 1, :length]
            alone_lp, alone_ent = token_logprobs(policy, ids, mask, temperature=0.7, with_entropy=True)
            torch.testing.assert_close(logprobs[b, :length], alone_lp[0], atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(entropy[b, :length], alone_ent[0], atol=1e-6, rtol=1e-5)
            alone_values = shifted_values(critic, ids, mask)[0]
            torch.testing.assert_close(values[b, :length], alone_values, atol=1e-6, rtol=1e-5)
            assert torch.all(logprobs[b, length:] == 0) and torch.all(values[b, length:] == 0)
    assert logprobs.shape == entropy.shape == values.shape == (ROWS, 6)
    # Row 6 shares row 0's pass: same distributions and values, its own label at position 3.
    assert torch.equal(logprobs[6, :3], logprobs[0, :3]) and logprobs[6, 3] != logprobs[0, 3]
    assert torch.equal(entropy[6], entropy[0]) and torch.equal(values[6], values[0])


def test_no_grad_forward_runs_only_the_distinct_rows_of_the_whole_batch():
    model = tiny_llama()
    seen = rows_seen_by(model)
    batch = TensorDict({"input_ids": IDS, "attention_mask": MASK}, batch_size=[ROWS])

    def run(dedupe: bool) -> torch.Tensor:
        def forward(model, micro):
            ids, mask = micro["input_ids"], micro["attention_mask"]
            return {"logprobs": token_logprobs(model, ids, mask, 1.0, dedupe=dedupe)[0]}

        return forward_in_micro_batches(model, batch, forward, 2, torch.device("cpu"), dedupe)

    deduped = run(dedupe=True)
    assert seen == [2, 2]  # 4 distinct rows in micro-batches of 2, not 8 rows
    full = run(dedupe=False)
    assert seen[2:] == [2, 2, 2, 2]
    torch.testing.assert_close(deduped["logprobs"], full["logprobs"], atol=1e-6, rtol=1e-5)
    # back in batch order although micro-batches regrouped the rows: own last token, own log-prob
    assert deduped["logprobs"][4, 5] != deduped["logprobs"][1, 5]
    assert not torch.equal(deduped["logprobs"][0], deduped["logprobs"][5])


# ---- gradients ------------------------------------------------------------------------------
def duplicated_ppo_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """IDS with per-row advantages, old log-probs and response masks that differ between rows
    sharing a forward pass."""
    generator = torch.Generator().manual_seed(seed)
    response_mask = MASK.float()
    response_mask[:, :2] = 0
    response_mask[2, 2] = 0  # a copy of row 0 whose response starts one token later
    with torch.no_grad():
        logprobs, _ = token_logprobs(tiny_llama(), IDS, MASK, temperature=1.0)
    # Old log-probs 0.5 off in either direction: ratios e^-0.5 and e^0.5, some clipped.
    shift = 0.5 * torch.randint(-1, 2, IDS.shape, generator=generator)
    return {
        "old_logprobs": (logprobs + shift) * response_mask,
        "advantages": torch.randn(IDS.shape, generator=generator) * response_mask,
        "response_mask": response_mask,
    }


def full_batch_logprobs(model) -> torch.Tensor:
    """log p(token t | tokens < t) of all rows in one plain forward pass: the reference."""
    log_p = torch.log_softmax(model(input_ids=IDS, attention_mask=MASK).logits[:, :-1], dim=-1)
    picked = log_p.gather(-1, IDS[:, 1:, None])[..., 0] * MASK[:, 1:]
    return torch.nn.functional.pad(picked, (1, 0))


def full_batch_values(model) -> torch.Tensor:
    """The head's output at t - 1 for all rows in one plain forward pass: the reference."""
    head = model(input_ids=IDS, attention_mask=MASK).logits[:, :-1, 0] * MASK[:, 1:]
    return torch.nn.functional.pad(head, (1, 0))


def policy_gradient(deduped: bool, data: dict[str, torch.Tensor], mode: str):
    model = tiny_llama()
    logprobs = token_logprobs(model, IDS, MASK, 1.0)[0] if deduped else full_batch_logprobs(model)
    loss, metrics = ppo_policy_loss(
        logprobs, data["old_logprobs"], data["advantages"], data["response_mask"], 0.2, None, mode
    )
    loss.backward()
    return loss.item(), metrics, [p.grad for p in model.parameters()]


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum"])
def test_ppo_gradient_with_dedupe_equals_the_full_batch_gradient(mode):
    data = duplicated_ppo_batch()
    # rows sharing row 0's pass (2: copy, 6: other last token) have their own advantages
    assert not torch.equal(data["advantages"][0], data["advantages"][2])
    assert data["advantages"][0, 3] != data["advantages"][6, 3] and data["response_mask"][6, 3] == 1
    loss, metrics, grads = policy_gradient(True, data, mode)
    full_loss, _, full_grads = policy_gradient(False, data, mode)

    assert 0 < metrics["losses/clipfrac"] < 1  # clipped and unclipped tokens both present
    assert loss == pytest.approx(full_loss, rel=1e-6)
    assert any(float(g.abs().max()) > 1e-3 for g in grads)
    for got, want in zip(grads, full_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_value_gradient_with_dedupe_equals_the_full_batch_gradient():
    data = duplicated_ppo_batch(seed=1)
    grads = []
    for dedupe in (True, False):
        model = tiny_value_model()
        values = shifted_values(model, IDS, MASK) if dedupe else full_batch_values(model)
        # rows sharing a pass have their own targets: row r's return is r + 1, old values differ
        returns = torch.arange(1.0, ROWS + 1.0)[:, None] * data["response_mask"]
        old_values = values.detach() + data["advantages"]
        value_loss(values, old_values, returns, data["response_mask"], 0.3)[0].backward()
        grads.append([p.grad for p in model.parameters()])
    assert any(float(g.abs().max()) > 1e-3 for g in grads[0])
    for got, want in zip(*grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


# ---- workers --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_llama")
    tiny_llama().save_pretrained(path)
    return str(path)


def repeated_batch(labels: list[int], width: int = 8) -> TensorDict:
    """Row i is distinct row `labels[i]` (3-token prompt, response up to the row's length) ending in
    its own last token 1 + i % 7, so rows of one label differ in their last token (the answer)."""
    generator = torch.Generator().manual_seed(0)
    distinct = torch.randint(1, VOCAB, (max(labels) + 1, width), generator=generator)
    lengths = torch.tensor([5 + label % 4 for label in labels])[:, None]
    positions = torch.arange(width)
    attention_mask = (positions < lengths).long()
    input_ids = distinct[labels] * attention_mask
    input_ids[torch.arange(len(labels)), lengths[:, 0] - 1] = 1 + torch.arange(len(labels)) % 7
    return TensorDict(
        {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "response_mask": ((positions >= 3) & (positions < lengths)).float(),
        },
        batch_size=[len(labels)],
    )


LOSS = PolicyLossOptions(entropy_coef=0.01)
ARGS = TrainingArgs(learning_rate=1e-2, per_device_train_batch_size=2, gradient_accumulation_steps=3)


def minibatch_distinct_counts(labels: list[int], mini_batch: int, epochs: int, *seed_keys: object):
    """(distinct labels, rows) of each mini-batch, in the order shuffled_minibatches draws."""
    counts = []
    for epoch in range(epochs):
        generator = torch.Generator().manual_seed(derive_seed(*seed_keys, epoch))
        order = torch.randperm(len(labels), generator=generator).tolist()
        for start in range(0, len(labels), mini_batch):
            chunk = [labels[i] for i in order[start : start + mini_batch]]
            counts.append((len(set(chunk)), len(chunk)))
    return counts


def test_actor_train_with_dedupe_updates_weights_as_without(model_dir):
    labels = [0, 1, 0, 2, 0, 1, 3, 0, 2, 0, 1, 0]  # 12 rows, 4 distinct; mini-batches of 6
    batch = repeated_batch(labels)
    assert not torch.equal(batch["input_ids"][0], batch["input_ids"][2])  # same label, own answer
    results = {}
    for dedupe in (True, False):
        worker = ActorWorker(model_dir, ARGS, total_train_steps=2, seed=7, num_threads=1, dedupe_rows=dedupe)
        batch["old_logprobs"] = worker.compute_logprobs(batch, 1.0)
        batch["advantages"] = torch.linspace(-1, 1, 12)[:, None] * batch["response_mask"]
        seen, grads = rows_seen_by(worker.strategy.model), capture_grads(worker.strategy)
        metrics = worker.train(batch, LOSS, ppo_epochs=2, step=0)
        results[dedupe] = (metrics, grads, worker.get_weights(), sum(seen))

    (metrics, grads, weights, rows), (full_metrics, full_grads, full_weights, full_rows) = results.values()
    assert full_rows == 24  # 2 epochs x 12 rows without dedupe
    # with dedupe the model sees each mini-batch's distinct labels once, whatever the answers
    assert rows == sum(distinct for distinct, _ in minibatch_distinct_counts(labels, 6, 2, 7, "minibatch", 0))
    assert len(grads) == len(full_grads) == 4  # 2 epochs x 2 mini-batches
    for step_grads, full_step_grads in zip(grads, full_grads, strict=True):
        for got, want in zip(step_grads, full_step_grads, strict=True):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-4)
    for key, value in full_weights.items():
        # Adam divides by |g|: a gradient near 0 moves its weight by up to lr whatever its size, so
        # 1e-6 noise there shows as ~1e-5 in the weight. Steps are ~lr = 1e-2 per element.
        torch.testing.assert_close(weights[key], value, atol=1e-4, rtol=0)
    assert metrics.keys() == full_metrics.keys()
    for key in ("losses/policy_loss", "losses/entropy", "losses/approx_kl", "actor/unique_row_ratio"):
        assert metrics[key] == pytest.approx(full_metrics[key], rel=1e-5, abs=1e-7), key


def test_unique_row_ratio_metrics_are_exact(model_dir):
    labels = [0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 0, 1]  # 12 rows, 4 distinct (each row its own answer)
    batch = repeated_batch(labels)
    batch["advantages"] = torch.ones(12, 8) * batch["response_mask"]
    actor = ActorWorker(model_dir, ARGS, total_train_steps=2, seed=7, num_threads=1)
    batch["old_logprobs"] = actor.compute_logprobs(batch, 1.0)
    metrics = actor.train(batch, LOSS, ppo_epochs=2, step=0)
    counts = minibatch_distinct_counts(labels, 6, 2, 7, "minibatch", 0)
    expected = sum(distinct / rows for distinct, rows in counts) / len(counts)
    assert metrics["actor/unique_row_ratio"] == pytest.approx(expected, rel=1e-12)
    assert 4 / 12 < expected < 1  # the draw splits a label's rows over mini-batches

    whole = ARGS.model_copy(update={"gradient_accumulation_steps": 6})  # one mini-batch of 12 rows
    critic = CriticWorker(model_dir, whole, total_train_steps=2, seed=7, num_threads=1)
    batch["values"] = critic.compute_values(batch)
    batch["returns"] = batch["response_mask"]
    metrics = critic.train(batch, ppo_epochs=1, value_clip=None, loss_agg_mode="token-mean", step=0)
    assert metrics["critic/unique_row_ratio"] == 4 / 12
