"""TorchTrainStrategy against hand computations on a tiny random Llama (CPU, no Ray)."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch
from tensordict import TensorDict

from roll.algorithms.losses import agg_loss
from roll.distributed.micro_batches import token_logprobs
from roll.distributed.strategies.torch_train import TorchTrainStrategy
from tests.conftest import tiny_llama

torch.set_num_threads(1)
VOCAB = 32


def make_strategy(model=None, **overrides) -> TorchTrainStrategy:
    kwargs = dict(
        learning_rate=1e-2,
        weight_decay=0.0,
        adam_betas=(0.9, 0.999),
        adam_epsilon=1e-8,
        lr_scheduler_type="constant",
        warmup_steps=0,
        total_steps=10,
        max_grad_norm=1e6,
        micro_batch_size=4,
        metric_prefix="actor",
    )
    return TorchTrainStrategy(model if model is not None else tiny_llama(), **(kwargs | overrides))


def make_batch(lengths: list[int], prompt_lengths: list[int], width: int, seed: int = 0) -> TensorDict:
    """Right-padded rows of `lengths[i]` tokens; those after `prompt_lengths[i]` are the response."""
    generator = torch.Generator().manual_seed(seed)
    positions = torch.arange(width)
    lengths_t, prompts_t = torch.tensor(lengths)[:, None], torch.tensor(prompt_lengths)[:, None]
    attention_mask = (positions < lengths_t).long()
    input_ids = torch.randint(1, VOCAB, (len(lengths), width), generator=generator) * attention_mask
    response_mask = ((positions >= prompts_t) & (positions < lengths_t)).float()
    advantages = torch.randn(len(lengths), width, generator=generator) * response_mask
    return TensorDict(
        {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "response_mask": response_mask,
            "advantages": advantages,
        },
        batch_size=[len(lengths)],
    )


def reinforce_loss(model, micro, mode="token-mean"):
    """-A * log p aggregated by `mode`: a loss whose gradient depends on every row."""
    logprobs, _ = token_logprobs(model, micro["input_ids"], micro["attention_mask"], temperature=1.0)
    loss = agg_loss(-micro["advantages"] * logprobs, micro["response_mask"], mode)
    return loss, {"loss": loss.item()}


def capture_grads(strategy: TorchTrainStrategy) -> list[list[torch.Tensor]]:
    """Gradients as the optimizer sees them (after accumulation and clipping), one list per step."""
    captured: list[list[torch.Tensor]] = []
    strategy.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: captured.append([p.grad.clone() for p in strategy.model.parameters()])
    )
    return captured


def global_norm(tensors) -> float:
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t) for t in tensors])))


# ---- forward_logprobs -----------------------------------------------------------------------
@pytest.mark.parametrize("scored", ["response", "every_token"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_forward_logprobs_matches_manual_log_softmax(temperature, scored):
    """With a response mask only response tokens are scored (0 elsewhere); without one, every
    real token after the first."""
    strategy = make_strategy()
    batch = make_batch([6, 9, 4], [2, 3, 1], width=10)
    prompts = [2, 3, 1] if scored == "response" else [1, 1, 1]
    if scored == "every_token":
        batch = batch.exclude("response_mask")
    logprobs, entropy = strategy.forward_logprobs(batch, temperature, with_entropy=True, micro_batch_size=2)

    with torch.no_grad():
        logits = strategy.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    expected_lp, expected_ent = torch.zeros(3, 10), torch.zeros(3, 10)
    for b, (prompt, length) in enumerate(zip(prompts, [6, 9, 4], strict=True)):
        for t in range(prompt, length):
            log_p = torch.log_softmax(logits[b, t - 1] / temperature, dim=-1)
            expected_lp[b, t] = log_p[batch["input_ids"][b, t]]
            expected_ent[b, t] = -(log_p.exp() * log_p).sum()
    assert logprobs.shape == entropy.shape == (3, 10)
    torch.testing.assert_close(logprobs, expected_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy, expected_ent, atol=1e-5, rtol=1e-5)
    assert strategy.forward_logprobs(batch, temperature)[1] is None


def test_padding_and_trimming_do_not_change_real_token_logprobs():
    strategy = make_strategy()
    short = make_batch([5], [2], width=5, seed=1)
    batched = make_batch([5, 9], [2, 2], width=12, seed=2)
    batched["input_ids"][0, :5] = short["input_ids"][0]
    widths = []
    strategy.model.register_forward_pre_hook(
        lambda module, args, kwargs: widths.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )

    alone, _ = strategy.forward_logprobs(short, 1.0)
    together, _ = strategy.forward_logprobs(batched, 1.0, micro_batch_size=2)

    assert widths == [5, 9]  # the all-padding columns 9..11 never reach the model
    torch.testing.assert_close(together[0, :5], alone[0], atol=1e-5, rtol=1e-5)
    assert together.shape == (2, 12)
    assert torch.all(together[0, 5:] == 0) and torch.all(together[:, 9:] == 0)


# ---- train_step -----------------------------------------------------------------------------
@pytest.mark.parametrize(("mode", "weight_by"), [("token-mean", "tokens"), ("seq-mean-token-mean", "rows")])
def test_gradient_accumulation_equals_one_big_micro_batch(mode, weight_by):
    # Response lengths 1, 5, 0 and 3 tokens: a wrong per-micro weight would change the gradient.
    batch = make_batch([4, 9, 3, 6], [3, 4, 3, 3], width=9)
    loss_fn = partial(reinforce_loss, mode=mode)
    results = {}
    for micro_batch_size in (4, 2, 1):
        strategy = make_strategy(micro_batch_size=micro_batch_size)
        grads = capture_grads(strategy)
        metrics = strategy.train_step(batch, loss_fn, weight_by)
        results[micro_batch_size] = (grads[0], strategy.state_dict(), metrics["loss"])

    reference_model = tiny_llama()
    full_loss, _ = loss_fn(reference_model, batch)
    full_loss.backward()
    manual_grads = [p.grad for p in reference_model.parameters()]
    for micro_batch_size in (4, 2, 1):
        grads, weights, loss = results[micro_batch_size]
        for got, want in zip(grads, manual_grads, strict=True):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-4)
        for key, value in weights.items():
            torch.testing.assert_close(value, results[4][1][key], atol=1e-5, rtol=1e-5)  # Adam: ~lr * sign(g)
        assert loss == pytest.approx(full_loss.item(), rel=1e-5)


def test_grad_norm_is_clipped_and_reported_before_clipping():
    batch = make_batch([6, 8], [2, 3], width=8)
    strategy = make_strategy(max_grad_norm=1e-3)
    grads = capture_grads(strategy)
    metrics = strategy.train_step(batch, reinforce_loss)

    model = tiny_llama()
    reinforce_loss(model, batch)[0].backward()
    unclipped = global_norm([p.grad for p in model.parameters()])
    assert unclipped > 1e-2
    assert metrics["actor/grad_norm"] == pytest.approx(unclipped, rel=1e-4)
    assert global_norm(grads[0]) == pytest.approx(1e-3, rel=1e-4)
    assert metrics["actor/skipped_steps"] == 0.0
    assert all(p.grad is None for p in strategy.model.parameters())  # zeroed for the next step


@pytest.mark.filterwarnings(r"ignore:Detected call of `lr_scheduler.step\(\)` before")  # no optimizer step here
@pytest.mark.parametrize(
    ("scheduler", "expected"),
    [
        # HF schedules, warmup 2 of 6 steps: warmup lr = peak * s / 2.
        ("constant", [0.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0]),
        ("linear", [0.0, 0.5, 1.0, 0.75, 0.5, 0.25, 0.0]),  # then peak * (6 - s) / 4
        # then peak * 0.5 * (1 + cos(pi * (s - 2) / 4))
        (
            "cosine",
            [0.0, 0.5, 1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.5 * (1 - math.cos(math.pi / 4)), 0.0],
        ),
    ],
)
def test_lr_schedule_with_warmup(scheduler, expected):
    strategy = make_strategy(learning_rate=1e-3, lr_scheduler_type=scheduler, warmup_steps=2, total_steps=6)
    lrs = []
    for _ in range(7):
        lrs.append(strategy.current_lr())
        strategy.step_lr_scheduler()
    assert lrs == pytest.approx([1e-3 * x for x in expected], abs=1e-12)


@pytest.mark.filterwarnings(r"ignore:Detected call of `lr_scheduler.step\(\)` before")
def test_train_step_reports_the_lr_it_used():
    strategy = make_strategy(learning_rate=1e-3, lr_scheduler_type="linear", warmup_steps=2, total_steps=6)
    strategy.step_lr_scheduler()
    assert strategy.train_step(make_batch([5], [2], width=5), reinforce_loss)["actor/lr"] == pytest.approx(5e-4)


def test_non_finite_loss_or_grad_skips_the_step():
    batch = make_batch([6, 8], [2, 3], width=8)
    strategy = make_strategy()
    before = strategy.state_dict()

    def nan_loss(model, micro):
        loss, metrics = reinforce_loss(model, micro)
        return loss * float("nan"), metrics

    def nan_grad(model, micro):  # finite value 0, gradient 0 * inf = nan
        return (next(model.parameters()).flatten()[0] * 0).sqrt(), {}

    # A NaN loss is never back-propagated (grad norm 0); a NaN gradient shows in the norm.
    for streak, (loss_fn, is_grad_norm_finite) in enumerate(((nan_loss, True), (nan_grad, False)), 1):
        metrics = strategy.train_step(batch, loss_fn)
        assert metrics["actor/skipped_steps"] == 1.0
        assert metrics["actor/consecutive_skipped_steps"] == streak
        assert math.isfinite(metrics["actor/grad_norm"]) == is_grad_norm_finite
        assert strategy.optimizer.state == {}  # no Adam moment was touched
        for key, value in strategy.state_dict().items():
            assert torch.equal(value, before[key]), key

    metrics = strategy.train_step(batch, reinforce_loss)
    assert metrics["actor/skipped_steps"] == 0.0 and metrics["actor/consecutive_skipped_steps"] == 0.0
    assert not torch.equal(strategy.state_dict()["lm_head.weight"], before["lm_head.weight"])


# ---- weights and checkpoints ---------------------------------------------------------------
def test_state_dict_is_cpu_contiguous_and_round_trips():
    source = make_strategy()
    weights = source.state_dict()
    assert all(v.device.type == "cpu" and v.is_contiguous() and not v.requires_grad for v in weights.values())
    target = make_strategy(tiny_llama(seed=1))
    target.load_state_dict(weights)
    batch = make_batch([6, 8], [2, 3], width=8)
    torch.testing.assert_close(target.forward_logprobs(batch, 1.0)[0], source.forward_logprobs(batch, 1.0)[0])


def test_checkpoint_restores_weights_optimizer_and_schedule(tmp_path):
    schedule = dict(learning_rate=1e-2, lr_scheduler_type="linear", warmup_steps=1, total_steps=5)
    batch = make_batch([6, 8, 5], [2, 3, 1], width=8)
    original = make_strategy(**schedule)
    for _ in range(2):
        original.train_step(batch, reinforce_loss)
        original.step_lr_scheduler()
    original.save_checkpoint(tmp_path / "ckpt")
    assert {"model.safetensors", "config.json", "optimizer.pt", "scheduler.pt"} <= {
        p.name for p in (tmp_path / "ckpt").iterdir()
    }

    resumed = make_strategy(tiny_llama(seed=1), **schedule)
    resumed.load_checkpoint(tmp_path / "ckpt")
    assert resumed.current_lr() == original.current_lr() == pytest.approx(1e-2 * 3 / 4)
    for key, value in original.state_dict().items():
        assert torch.equal(resumed.state_dict()[key], value), key
    for p_orig, p_res in zip(original.model.parameters(), resumed.model.parameters(), strict=True):
        for moment in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(original.optimizer.state[p_orig][moment], resumed.optimizer.state[p_res][moment])

    for _ in range(2):  # the second step only matches if the scheduler's position was restored
        assert resumed.train_step(batch, reinforce_loss) == original.train_step(batch, reinforce_loss)
        resumed.step_lr_scheduler()
        original.step_lr_scheduler()
    assert resumed.current_lr() == original.current_lr() == pytest.approx(1e-2 * 1 / 4)
    for key, value in original.state_dict().items():
        assert torch.equal(resumed.state_dict()[key], value), key


def test_a_longer_resumed_run_continues_on_its_own_schedule(tmp_path):
    """A finished 2-step cosine run resumed with max_steps=5: step 3 trains at the 5-step
    cosine's value for step 3 (by hand: 1e-2 * (1 + cos(pi * 2/5)) / 2 = 6.545e-3), not at the
    0.0 where the 2-step schedule ended; then the schedule goes on from there without a jump."""
    import math

    batch = make_batch([6, 8, 5], [2, 3, 1], width=8)
    short = make_strategy(learning_rate=1e-2, lr_scheduler_type="cosine", warmup_steps=0, total_steps=2)
    for _ in range(2):
        short.train_step(batch, reinforce_loss)
        short.step_lr_scheduler()
    assert short.current_lr() == pytest.approx(0.0, abs=1e-12)
    short.save_checkpoint(tmp_path / "ckpt")

    longer = make_strategy(
        tiny_llama(seed=1), learning_rate=1e-2, lr_scheduler_type="cosine", warmup_steps=0, total_steps=5
    )
    longer.load_checkpoint(tmp_path / "ckpt")
    seen = []
    for _ in range(3):  # steps 3, 4, 5
        seen.append(longer.current_lr())
        assert longer.optimizer.param_groups[0]["lr"] == seen[-1]  # what the optimizer really uses
        longer.train_step(batch, reinforce_loss)
        longer.step_lr_scheduler()
    assert seen == pytest.approx([1e-2 * (1 + math.cos(math.pi * t / 5)) / 2 for t in (2, 3, 4)])
