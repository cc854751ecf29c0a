"""The output head runs only at the positions whose tokens are scored (`roll.distributed.output_head`):
the log-probs, entropies and gradients of the scored tokens are those of a pass over every position,
the head sees exactly the positions some row scores, and models it cannot narrow give the same numbers.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from roll.distributed.micro_batches import token_logprobs
from roll.distributed.output_head import logits_at, output_head
from roll.distributed.sequence_packing import PackedSequences
from roll.models.lora import apply_lora
from tests.conftest import tiny_llama

torch.set_num_threads(1)
# Four rows (right-padded to 7); rows 0 and 2 are the same row up to their last token, so they share
# one forward. The response is the last 2 real tokens of rows 0-2 and none of row 3.
IDS = torch.tensor(
    [
        [3, 9, 4, 7, 5, 0, 0],
        [5, 2, 8, 1, 6, 2, 4],
        [3, 9, 4, 7, 11, 0, 0],
        [8, 8, 3, 1, 0, 0, 0],
    ]
)
LENGTHS = [5, 7, 5, 4]
MASK = (torch.arange(7) < torch.tensor(LENGTHS)[:, None]).long()
RESPONSE = torch.zeros(4, 7)
RESPONSE[0, 3:5] = RESPONSE[1, 5:7] = RESPONSE[2, 3:5] = 1


def full_logprobs(model, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropies of every real token by hand, from the model's full (B, T, V) logits."""
    logits = model(input_ids=IDS, attention_mask=MASK).logits / temperature
    log_p = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = log_p.gather(-1, IDS[:, 1:, None])[..., 0]
    entropy = -(log_p.exp() * log_p).sum(-1)
    pad = torch.nn.functional.pad
    return pad(picked * MASK[:, 1:], (1, 0)), pad(entropy * MASK[:, 1:], (1, 0))


class HeadCalls:
    """Records how many positions each call of `module` mapped."""

    def __init__(self, module: nn.Module) -> None:
        self.positions: list[int] = []
        module.register_forward_hook(lambda m, args, out: self.positions.append(out.shape[:-1].numel()))


def test_scored_tokens_have_the_full_pass_values_and_gradients():
    model = tiny_llama(seed=1)
    calls = HeadCalls(model.lm_head)
    logprobs, entropy = token_logprobs(model, IDS, MASK, 0.7, with_entropy=True, scored=RESPONSE)
    loss = (logprobs * torch.arange(1.0, 8.0)).sum() + entropy.sum()
    narrowed = torch.autograd.grad(loss, list(model.parameters()))
    # rows 0 and 2 share a forward and score the same two positions: 2 + 2 positions, not 4 x 7
    assert calls.positions == [4]

    full_lp, full_ent = full_logprobs(model, 0.7)
    torch.testing.assert_close(logprobs, full_lp * RESPONSE, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(entropy, full_ent * RESPONSE, atol=1e-6, rtol=1e-5)
    full_loss = (full_lp * RESPONSE * torch.arange(1.0, 8.0)).sum() + (full_ent * RESPONSE).sum()
    for got, want in zip(narrowed, torch.autograd.grad(full_loss, list(model.parameters())), strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-4)


def test_without_scored_mask_every_real_token_is_scored_and_padding_is_skipped():
    model = tiny_llama(seed=2)
    calls = HeadCalls(model.lm_head)
    with torch.no_grad():
        logprobs, _ = token_logprobs(model, IDS, MASK, 1.0, dedupe=False)
        torch.testing.assert_close(logprobs, full_logprobs(model, 1.0)[0], atol=1e-6, rtol=1e-5)
    assert calls.positions[0] == sum(n - 1 for n in LENGTHS)  # each real position that predicts a token


def test_a_model_without_an_output_head_gives_the_same_numbers():
    class NoHead(nn.Module):
        """Calls the model but hides get_output_embeddings (as Megatron's MegatronCausalLM has none)."""

        def __init__(self, model: nn.Module) -> None:
            super().__init__()
            self.inner = model

        def forward(self, **kwargs):
            return self.inner(**kwargs)

    model = tiny_llama(seed=3)
    wrapped = NoHead(model)
    assert output_head(wrapped) is None
    with torch.no_grad():
        got, _ = token_logprobs(wrapped, IDS, MASK, 1.0, scored=RESPONSE)
        want, _ = token_logprobs(model, IDS, MASK, 1.0, scored=RESPONSE)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_packed_rows_narrow_the_head_at_packed_positions():
    model = tiny_llama(seed=4)
    calls = HeadCalls(model.lm_head)
    with torch.no_grad():
        packed, _ = token_logprobs(PackedSequences(model), IDS, MASK, 1.0, scored=RESPONSE, dedupe=False)
        padded, _ = token_logprobs(model, IDS, MASK, 1.0, scored=RESPONSE, dedupe=False)
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=1e-5)
    assert calls.positions == [6, 6]  # two response tokens in each of rows 0-2


def test_the_head_is_found_through_wrappers():
    model = tiny_llama(seed=5)
    lora = apply_lora(tiny_llama(seed=5), rank=2, alpha=4, target="all-linear")

    class Engine(nn.Module):  # DDP and DeepSpeed's engine hold the model as .module
        def __init__(self, module: nn.Module) -> None:
            super().__init__()
            self.module = module

    assert output_head(model) is model.lm_head
    assert output_head(Engine(model)) is model.lm_head
    assert output_head(PackedSequences(model)) is model.lm_head
    assert output_head(lora) is lora.get_output_embeddings()
    with torch.no_grad():  # LoRA's B starts at 0: the adapted model scores as the base one
        got, _ = token_logprobs(lora, IDS, MASK, 1.0, scored=RESPONSE)
        want, _ = token_logprobs(model, IDS, MASK, 1.0, scored=RESPONSE)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_a_pass_with_nothing_scored_still_reaches_every_parameter():
    """Ranks kept in step run stand-in micro-batches with no response token: their backward must
    still give every parameter a gradient (zero), as a full pass does."""
    model = tiny_llama(seed=6)
    logprobs, entropy = token_logprobs(model, IDS, MASK, 1.0, with_entropy=True, scored=torch.zeros(4, 7))
    assert not logprobs.any() and not entropy.any()
    (logprobs.sum() + entropy.sum()).backward()
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())


def test_logits_at_numbers_positions_in_row_major_order():
    model = tiny_llama(seed=7)
    rows, cols = torch.tensor([1, 0, 1, 0]), torch.tensor([2, 4, 2, 1])
    inputs = {"input_ids": IDS[:2], "attention_mask": MASK[:2]}
    with torch.no_grad():
        logits, slot = logits_at(model, inputs, rows, cols)
        full = model(**inputs).logits
    assert slot.tolist() == [2, 1, 2, 0]  # distinct positions (0, 1), (0, 4), (1, 2)
    torch.testing.assert_close(logits, full[[0, 0, 1], [1, 4, 2]])


def test_logits_at_other_positions_than_the_inputs_are_refused():
    """A model whose head cannot be narrowed and whose logits do not match its inputs' positions
    (one extra here) would have its log-probs read from other positions: an error instead."""

    class OneMore(nn.Module):
        def __init__(self, model: nn.Module) -> None:
            super().__init__()
            self.inner = model

        def forward(self, **kwargs):
            logits = self.inner(**kwargs).logits
            return SimpleNamespace(logits=torch.cat([logits, logits[:, -1:]], dim=1))

    with pytest.raises(ValueError, match="logits at 32 positions for 28 inputs"):
        token_logprobs(OneMore(tiny_llama(seed=8)), IDS, MASK, 1.0, scored=RESPONSE, dedupe=False)
