"""Actor, critic and reference roles on a tiny random Llama saved to disk (CPU, no Ray)."""

from __future__ import annotations

from itertools import pairwise

import pytest
import torch
from tensordict import TensorDict
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedTokenizerFast,
)

from roll.algorithms.actor_loss import PolicyLossOptions
from roll.algorithms.utils import masked_mean
from roll.configs.worker import TrainingArgs
from roll.core.seeding import derive_seed
from roll.distributed.workers.actor import ActorWorker
from roll.distributed.workers.common import average_metrics, shuffled_minibatches
from roll.distributed.workers.critic import CriticWorker
from roll.distributed.workers.reference import ReferenceWorker
from tests.conftest import save_tiny_llama

torch.set_num_threads(1)
VOCAB = 32
# micro-batches of 2, two per optimizer step: mini-batches of 4 rows
ARGS = TrainingArgs(learning_rate=1e-2, per_device_train_batch_size=2, gradient_accumulation_steps=2)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random 2-layer Llama (vocab 32, hidden 32) and a word-level tokenizer, as an HF dir."""
    path = save_tiny_llama(tmp_path_factory.mktemp("tiny_llama"), seed=0, vocab_size=VOCAB)
    vocab = {"<pad>": 0} | {f"w{i}": i for i in range(1, VOCAB)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>").save_pretrained(path)
    return str(path)


def make_batch(lengths: list[int], prompt_lengths: list[int], width: int, seed: int = 0) -> TensorDict:
    """Right-padded rows; tokens after `prompt_lengths[i]` up to `lengths[i]` are the response."""
    generator = torch.Generator().manual_seed(seed)
    positions = torch.arange(width)
    lengths_t, prompts_t = torch.tensor(lengths)[:, None], torch.tensor(prompt_lengths)[:, None]
    attention_mask = (positions < lengths_t).long()
    input_ids = torch.randint(1, VOCAB, (len(lengths), width), generator=generator) * attention_mask
    response_mask = ((positions >= prompts_t) & (positions < lengths_t)).float()
    return TensorDict(
        {"input_ids": input_ids, "attention_mask": attention_mask, "response_mask": response_mask},
        batch_size=[len(lengths)],
    )


def ppo_batch(actor: ActorWorker, advantages_by_row: list[float], temperature: float = 1.0) -> TensorDict:
    """Rows of 3-token prompts and 3..6-token responses, old log-probs from the actor itself."""
    n = len(advantages_by_row)
    batch = make_batch([6 + i % 4 for i in range(n)], [3] * n, width=10, seed=n)
    batch["old_logprobs"] = actor.compute_logprobs(batch, temperature)
    batch["advantages"] = torch.tensor(advantages_by_row)[:, None] * batch["response_mask"]
    return batch


def actor(model_dir, **kwargs) -> ActorWorker:
    return ActorWorker(model_dir, kwargs.pop("args", ARGS), total_train_steps=4, seed=7, num_threads=1, **kwargs)


LOSS = PolicyLossOptions()


# ---- actor ----------------------------------------------------------------------------------
def test_first_update_metrics_are_the_hand_derived_ppo_values(model_dir):
    worker = actor(model_dir)
    batch = ppo_batch(worker, [1.0, -0.5, 2.0, 0.0])
    _, entropy = worker.strategy.forward_logprobs(batch, 1.0, with_entropy=True)

    metrics = worker.train(batch, LOSS, ppo_epochs=1, step=0)

    # One mini-batch of 4 rows, new policy == old policy: ratio 1, loss = -token-mean(A).
    mask = batch["response_mask"]
    assert metrics["losses/policy_loss"] == pytest.approx(-float(masked_mean(batch["advantages"], mask)), rel=1e-5)
    assert metrics["losses/approx_kl"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["losses/clipfrac"] == 0.0
    assert metrics["losses/entropy"] == pytest.approx(float(masked_mean(entropy, mask)), rel=1e-5)
    assert metrics["actor/lr"] == 1e-2 and metrics["actor/skipped_steps"] == 0.0
    assert metrics["actor/grad_norm"] > 0


def test_train_raises_logprobs_of_positive_advantage_tokens(model_dir):
    worker = actor(model_dir)
    batch = ppo_batch(worker, [1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
    worker.train(batch, LOSS, ppo_epochs=2, step=0)

    change = (worker.compute_logprobs(batch, 1.0) - batch["old_logprobs"]) * batch["response_mask"]
    per_row = change.sum(dim=-1)
    assert torch.all(per_row[0::2] > 0), per_row
    assert torch.all(per_row[1::2] < 0), per_row


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")  # no step was taken
def test_nan_advantages_skip_every_optimizer_step_and_are_counted(model_dir):
    worker = actor(model_dir)
    batch = ppo_batch(worker, [float("nan")] * 8)
    before = worker.get_weights()

    metrics = worker.train(batch, LOSS, ppo_epochs=2, step=0)

    assert metrics["actor/skipped_steps"] == 4.0  # 2 epochs x 2 mini-batches of 4 rows, summed
    for key, value in worker.get_weights().items():
        assert torch.equal(value, before[key]), key


def test_logprobs_and_weights_agree_with_reference_and_inference_views(model_dir):
    worker = actor(model_dir)
    reference = ReferenceWorker(model_dir, micro_batch_size=3, num_threads=1)
    batch = make_batch([5, 9, 7, 4], [2, 2, 2, 2], width=11)
    batch["token_level_rewards"] = torch.zeros(4, 11)  # extra keys are ignored

    torch.testing.assert_close(reference.compute_logprobs(batch, 0.7), worker.compute_logprobs(batch, 0.7))
    assert not reference.model.training
    assert not any(p.requires_grad for p in reference.model.parameters())
    weights = worker.get_weights()
    assert weights.keys() == worker.strategy.model.state_dict().keys()
    assert all(w.device.type == "cpu" and w.is_contiguous() and not w.requires_grad for w in weights.values())


def test_resumed_actor_reproduces_the_next_step(model_dir, tmp_path):
    args = ARGS.model_copy(update={"lr_scheduler_type": "linear", "warmup_steps": 1})
    original = actor(model_dir, args=args)
    batch = ppo_batch(original, [1.0, -1.0, 0.5, 2.0, -0.3, 1.5])
    for step in range(2):
        original.train(batch, LOSS, ppo_epochs=2, step=step)
    original.save_checkpoint(str(tmp_path / "ckpt"))
    expected = [original.train(batch, LOSS, ppo_epochs=2, step=step) for step in (2, 3)]

    resumed = actor(model_dir, args=args)
    resumed.load_checkpoint(str(tmp_path / "ckpt"))
    assert [resumed.train(batch, LOSS, ppo_epochs=2, step=step) for step in (2, 3)] == expected
    # linear over 4 steps with warmup 1: lr * (4 - step) / 3
    assert [m["actor/lr"] for m in expected] == pytest.approx([1e-2 * 2 / 3, 1e-2 * 1 / 3])
    resumed_weights = resumed.get_weights()
    for key, value in original.get_weights().items():
        assert torch.equal(resumed_weights[key], value), key


def test_checkpoint_is_a_loadable_hf_model_dir_with_tokenizer(model_dir, tmp_path):
    worker = actor(model_dir)
    worker.train(ppo_batch(worker, [1.0, -1.0, 0.5, 2.0]), LOSS, ppo_epochs=1, step=0)
    worker.save_checkpoint(str(tmp_path / "ckpt"))

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt")
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, worker.get_weights()[key]), key
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "ckpt")
    assert (
        tokenizer("w3 w17 w5")["input_ids"]
        == AutoTokenizer.from_pretrained(model_dir)("w3 w17 w5")["input_ids"]
        == [3, 17, 5]
    )


# ---- shared pieces --------------------------------------------------------------------------
def test_minibatches_follow_the_derived_permutation():
    batch = TensorDict({"row": torch.arange(10)}, batch_size=[10])
    chunks = [mb["row"] for mb in shuffled_minibatches(batch, 4, 7, "minibatch", 3, 1)]
    order = torch.randperm(10, generator=torch.Generator().manual_seed(derive_seed(7, "minibatch", 3, 1)))
    assert [len(c) for c in chunks] == [4, 4, 2]
    assert torch.equal(torch.cat(chunks), order)


def test_average_metrics_means_all_but_summed_counts():
    steps = [{"loss": 1.0, "skipped": 1.0}, {"loss": 3.0, "skipped": 0.0}, {"loss": 5.0, "skipped": 1.0}]
    assert average_metrics(steps, summed=("skipped",)) == {"loss": 3.0, "skipped": 2.0}


# ---- critic ---------------------------------------------------------------------------------
def critic(model_dir) -> CriticWorker:
    args = ARGS.model_copy(update={"learning_rate": 3e-3})
    return CriticWorker(model_dir, args, total_train_steps=10, seed=7, num_threads=1)


def test_critic_values_are_the_head_output_of_the_previous_position(model_dir):
    worker = critic(model_dir)
    batch = make_batch([5, 9, 7], [2, 2, 2], width=10)
    values = worker.compute_values(batch)

    with torch.no_grad():
        head = worker.strategy.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert head.shape == (3, 10, 1) and values.shape == (3, 10)
    for b, length in enumerate([5, 9, 7]):
        assert values[b, 0] == 0 and torch.all(values[b, length:] == 0)
        torch.testing.assert_close(values[b, 1:length], head[b, : length - 1, 0], atol=1e-5, rtol=1e-5)


def test_critic_training_reduces_value_loss_on_a_fixed_target(model_dir):
    worker = critic(model_dir)
    batch = make_batch([6, 9, 7, 10], [3] * 4, width=10)
    batch["returns"] = 1.0 * batch["response_mask"]
    batch["values"] = worker.compute_values(batch)
    start = 0.5 * float(masked_mean((batch["values"] - batch["returns"]) ** 2, batch["response_mask"]))

    # One mini-batch, values == old values: the loss is the untrained 0.5 * token-mean((V - R)^2).
    metrics = worker.train(batch, ppo_epochs=1, value_clip=0.5, loss_agg_mode="token-mean", step=0)
    assert metrics["losses/value_loss"] == pytest.approx(start, rel=1e-5)
    assert metrics["losses/value_clipfrac"] == 0.0
    assert metrics["critic/lr"] == 3e-3 and metrics["critic/skipped_steps"] == 0.0
    assert metrics["critic/grad_norm"] > 0

    losses = [start]
    for step in range(1, 5):
        batch["values"] = worker.compute_values(batch)
        losses.append(
            worker.train(batch, ppo_epochs=2, value_clip=0.5, loss_agg_mode="token-mean", step=step)[
                "losses/value_loss"
            ]
        )
    assert all(later < earlier for earlier, later in pairwise(losses)), losses
    assert losses[-1] < 0.1 * start, losses


def test_resumed_critic_has_the_saved_head_and_optimizer(model_dir, tmp_path):
    batch = make_batch([6, 9, 7, 10], [3] * 4, width=10)
    batch["returns"] = 1.0 * batch["response_mask"]
    original = critic(model_dir)
    batch["values"] = original.compute_values(batch)
    original.train(batch, ppo_epochs=1, value_clip=0.5, loss_agg_mode="token-mean", step=0)
    original.save_checkpoint(str(tmp_path / "critic"))
    batch["values"] = original.compute_values(batch)

    resumed = critic(model_dir)
    assert not torch.equal(resumed.compute_values(batch), batch["values"])  # the untrained head
    resumed.load_checkpoint(str(tmp_path / "critic"))
    assert torch.equal(resumed.compute_values(batch), batch["values"])
    kwargs = dict(ppo_epochs=1, value_clip=0.5, loss_agg_mode="token-mean", step=1)
    assert resumed.train(batch, **kwargs) == original.train(batch, **kwargs)


@pytest.mark.parametrize(
    ("num_threads", "device", "cores", "expected"),
    [
        (None, "cpu", 16, 16),  # a CPU role computes on every core (a CPU run passes its share instead)
        (None, "cuda", 16, 4),  # a GPU role's pool stays small: host-side preparation only
        (None, "cuda:0", 2, 2),
        (3, "cuda", 16, 3),  # its own num_threads wins
        (8, "cpu", 16, 8),
    ],
)
def test_a_roles_torch_threads_follow_its_device(monkeypatch, num_threads, device, cores, expected):
    from roll.distributed.workers import common

    chosen = []
    monkeypatch.setattr(common.os, "cpu_count", lambda: cores)
    monkeypatch.setattr(common.torch, "set_num_threads", chosen.append)
    common.set_num_threads(num_threads, device)
    assert chosen == [expected]
