"""ROLL's train_infer_correction inside the actor's update: a filter that every token fails leaves
the policy as it was (nothing is trained on), one that every token passes trains exactly as no
correction, and the metrics say so."""

import pytest
import torch

from roll.algorithms.actor_loss import PolicyLossOptions
from roll.distributed.workers.actor import ActorWorker
from tests.distributed.test_dedupe import (
    ARGS,
    model_dir,  # noqa: F401 - the fixture
    repeated_batch,
)

RULE = {
    "agg_type": "token",
    "ratio_enabled": True,
    "ratio_low": 0.8,
    "ratio_high": 1.2,
    "diff_enabled": False,
    "diff_low": -0.2,
    "diff_high": 0.2,
}


def loss(correction) -> PolicyLossOptions:
    return PolicyLossOptions(correction=correction)


def train(model_dir, infer_shift: float | None, correction) -> tuple[dict, dict, dict]:  # noqa: F811 - the fixture
    worker = ActorWorker(model_dir, ARGS, total_train_steps=2, seed=7, num_threads=1)
    batch = repeated_batch([0, 1, 2, 0, 1, 2])
    before = {k: v.clone() for k, v in worker.get_weights().items()}
    batch["old_logprobs"] = worker.compute_logprobs(batch, 1.0)
    batch["infer_logprobs"] = batch["old_logprobs"] + (infer_shift or 0.0)
    batch["advantages"] = torch.linspace(-1, 1, 6)[:, None] * batch["response_mask"]
    metrics = worker.train(batch, loss(correction), ppo_epochs=1, step=0)
    return metrics, before, worker.get_weights()


def test_a_filter_no_token_passes_trains_nothing_and_one_all_pass_trains_as_without(model_dir):  # noqa: F811
    metrics, before, after = train(model_dir, 1.0, {"is_weight": None, "filters": [RULE]})  # ratio e^-1 < 0.8
    assert metrics["actor/train_infer_final_mask_mean"] == 0.0
    assert all(torch.equal(before[k], after[k]) for k in before)

    kept, _, kept_weights = train(model_dir, 0.0, {"is_weight": None, "filters": [RULE]})
    plain, _, plain_weights = train(model_dir, None, None)
    assert kept["actor/train_infer_final_mask_mean"] == 1.0
    assert any(not torch.equal(before[k], plain_weights[k]) for k in before)
    for key, value in plain_weights.items():
        torch.testing.assert_close(kept_weights[key], value, atol=0, rtol=0)
    assert kept["losses/policy_loss"] == plain["losses/policy_loss"]


def test_segments_split_by_the_tokens_policy_versions_inside_the_update(model_dir):  # noqa: F811
    """Partial rollout: each response's first token was sampled by version 0 (its engine log-prob
    1 nat above the trainer's: ratio e^-1, outside [0.8, 1.2]), the rest by version 1 (ratio 1).
    A segment filter passes exactly the version-1 tokens, because `policy_version` reaches the
    loss; without it each response is one segment, judged by its mean ratio."""
    worker = ActorWorker(model_dir, ARGS, total_train_steps=2, seed=7, num_threads=1)
    batch = repeated_batch([0, 1, 2, 0, 1, 2])
    mask = batch["response_mask"]
    first = mask * (mask.cumsum(-1) == 1)  # each row's first response token
    batch["old_logprobs"] = worker.compute_logprobs(batch, 1.0)
    batch["infer_logprobs"] = batch["old_logprobs"] + first
    batch["advantages"] = torch.linspace(-1, 1, 6)[:, None] * mask
    batch["policy_version"] = torch.where(mask.bool(), (1 - first).long(), torch.full_like(mask, -1).long())
    segment = dict(RULE, agg_type="segment")
    metrics = worker.train(batch.clone(), loss({"is_weight": None, "filters": [segment]}), ppo_epochs=1, step=0)
    assert metrics["actor/train_infer_final_mask_mean"] == pytest.approx(12 / 18)  # 18 tokens, 6 of version 0
    del batch["policy_version"]
    whole = ActorWorker(model_dir, ARGS, total_train_steps=2, seed=7, num_threads=1).train(
        batch, loss({"is_weight": None, "filters": [segment]}), ppo_epochs=1, step=0
    )
    assert whole["actor/train_infer_final_mask_mean"] != metrics["actor/train_infer_final_mask_mean"]
