"""The cases every training engine is checked on against the plain `torch` strategy
(test_engine_strategies.py, test_megatron.py and their two-rank files): two PPO steps of 2 epochs x
2 mini-batches x 2 micro-batches on the `model_dir` fixture's tiny Llama, clipping active; and plain
language-model steps on a fixed mini-batch (`lm_minibatch`, `lm_loss`)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from roll.algorithms.actor_loss import PolicyLossOptions
from roll.configs.worker import TrainingArgs
from roll.distributed.workers.actor import ActorWorker

VOCAB = 32  # vocabulary of the `model_dir` fixture (tests/conftest.py: TINY_LLAMA_VOCAB)


ARGS = TrainingArgs(learning_rate=1e-2, per_device_train_batch_size=2, gradient_accumulation_steps=2, max_grad_norm=0.5)
# Weights are compared to 1e-4: Adam's early steps move a weight by about lr * g / |g|, so a
# gradient entry near 0 whose float round-off differs between engines moves by up to ~1e-5 more
# (measured 7e-6 on one entry of 512); an engine bug moves weights by ~lr = 1e-2.
WEIGHT_TOL = dict(rtol=1e-4, atol=1e-4)


def ppo_batch(actor: ActorWorker, n: int = 8, old: bool = True) -> TensorDict:
    """Rows with 3-token prompts and 3..6-token responses (right-padded); old log-probs from the
    actor itself. `old=False`: none (the actor takes them in `train`), and the engine's log-probs
    instead, the actor's own shifted by a fixed +-0.01 per token."""
    generator = torch.Generator().manual_seed(n)
    positions = torch.arange(10)
    lengths = torch.tensor([6 + i % 4 for i in range(n)])[:, None]
    attention_mask = (positions < lengths).long()
    batch = TensorDict(
        {
            "input_ids": torch.randint(1, VOCAB, (n, 10), generator=generator) * attention_mask,
            "attention_mask": attention_mask,
            "response_mask": ((positions >= 3) & (positions < lengths)).float(),
        },
        batch_size=[n],
    )
    logprobs = actor.compute_logprobs(batch, 1.0)
    batch["advantages"] = torch.randn(n, 1, generator=generator) * batch["response_mask"]
    if old:
        batch["old_logprobs"] = logprobs
    else:
        signs = torch.where(torch.arange(10) % 2 == 0, 1.0, -1.0)
        batch["infer_logprobs"] = (logprobs + 0.01 * signs) * batch["response_mask"]
    return batch


def make_actor(
    model_dir: str, name: str = "torch", config: dict | None = None, features: dict | None = None
) -> ActorWorker:
    """An actor on engine `name` (its `config`, and strategy `features` as `build_train_strategy`
    takes them) with `ARGS`, seed 7, one thread."""
    return ActorWorker(
        model_dir,
        ARGS,
        total_train_steps=4,
        seed=7,
        num_threads=1,
        strategy_name=name,
        strategy_config=config or {},
        features=features,
    )


def train_two_steps(
    model_dir: str, name: str, config: dict | None = None, features: dict | None = None
) -> tuple[list[dict], dict]:
    """The metrics of two PPO steps with `make_actor`'s actor and its weights after them."""
    actor = make_actor(model_dir, name, config, features)
    metrics = [
        actor.train(
            ppo_batch(actor),
            PolicyLossOptions(entropy_coef=0.01),
            ppo_epochs=2,
            step=step,
        )
        for step in range(2)
    ]
    return metrics, actor.get_weights()


def assert_same_training(got: tuple[list[dict], dict], want: tuple[list[dict], dict]) -> None:
    """Same losses, gradient norms and learning rates at every step, and the same final weights
    (same names, in the same order)."""
    (got_metrics, got_weights), (want_metrics, want_weights) = got, want
    for want_step, got_step in zip(want_metrics, got_metrics, strict=True):
        for key in ("losses/policy_loss", "losses/entropy", "losses/approx_kl", "actor/grad_norm", "actor/lr"):
            assert got_step[key] == pytest.approx(want_step[key], rel=1e-4, abs=1e-6), key
        assert got_step["actor/skipped_steps"] == 0
    assert want_metrics[1]["losses/approx_kl"] != 0  # the weights did move
    assert list(got_weights) == list(want_weights)
    for key, value in want_weights.items():
        torch.testing.assert_close(got_weights[key], value, **WEIGHT_TOL, msg=key)


def lm_minibatch(seed: int) -> TensorDict:
    """4 rows of 8 tokens, all counted: each half holds the same number of tokens, so the mean of
    two ranks' token-mean losses is the whole mini-batch's token-mean loss."""
    ids = torch.randint(1, VOCAB, (4, 8), generator=torch.Generator().manual_seed(seed))
    return TensorDict(
        {"input_ids": ids, "attention_mask": torch.ones_like(ids), "response_mask": torch.ones(4, 8)}, batch_size=[4]
    )


def lm_loss(scale: float = 1.0):
    """A `loss_fn` for `train_step`: the model's language-model loss on its own ids, times `scale`
    (NaN makes a non-finite loss)."""

    def loss_fn(model, micro):
        out = model(input_ids=micro["input_ids"], attention_mask=micro["attention_mask"], labels=micro["input_ids"])
        return out.loss * scale, {}

    return loss_fn


def padded_and_packed(model, ids: torch.Tensor, mask: torch.Tensor) -> list[tuple]:
    """(log-probs, entropies, gradients by parameter name) of `model` on the padded micro-batch,
    then of the same model run on packed rows (`PackedSequences`)."""
    from roll.distributed.micro_batches import token_logprobs
    from roll.distributed.sequence_packing import PackedSequences

    results = []
    for runner in (model, PackedSequences(model)):
        model.zero_grad()
        logprobs, entropy = token_logprobs(runner, ids, mask, temperature=0.7, with_entropy=True, dedupe=False)
        (logprobs.sum() + entropy.sum()).backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters()}
        results.append((logprobs.detach(), entropy.detach(), grads))
    return results
