"""Two FSDP2 ranks of `actor_train` as the pipeline starts them (two Ray actors, one gloo group,
`builders._start_role`) and calls them (`RankGroup`): old log-probs split by rows and merged, then
two PPO steps whose response-token counts differ between the ranks' shares, equal one process
training the whole batch with the torch strategy (ppo_cases.py: same losses, gradient norms,
weights), also when the ranks' shares need unequal numbers of passes; the checkpoint, a
collective, is written whole by rank 0."""

from __future__ import annotations

import pytest
import ray
import torch
from ppo_cases import ARGS, WEIGHT_TOL, assert_same_training, ppo_batch
from safetensors.torch import load_file

from roll.algorithms.actor_loss import PolicyLossOptions
from roll.configs.worker import TrainingArgs
from roll.distributed.placement import plan_devices
from roll.distributed.rank_group import RankGroup
from roll.distributed.workers.actor import ActorWorker
from roll.distributed.workers.common import shuffled_minibatches
from roll.pipeline.setup.builders import _start_role

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]  # ranks whose collectives mismatch would hang
# Per rank: micro-batches of 1, 2 of them; over 2 ranks the mini-batch is ARGS's 4 rows.
RANK_ARGS = TrainingArgs(
    learning_rate=ARGS.learning_rate,
    per_device_train_batch_size=1,
    gradient_accumulation_steps=2,
    max_grad_norm=ARGS.max_grad_norm,
)


class _GroupActor:
    """The `ActorWorker` methods the test calls, run on the ranks through the group, as the
    pipeline runs them."""

    def __init__(self, group: RankGroup):
        self.group = group

    def compute_logprobs(self, batch, temperature):
        return ray.get(self.group.compute_logprobs.remote(batch, temperature))

    def train(self, batch, *args, **kwargs):
        return ray.get(self.group.train.remote(batch, *args, **kwargs))

    def get_weights(self):
        return ray.get(self.group.get_weights.remote())


@pytest.fixture(scope="module")
def fsdp2_ranks(model_dir):
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    plan = plan_devices(
        {"actor_train": None},
        strategies={"actor_train": "fsdp2"},
        inference_replicas=1,
        visible_gpus=0,
        world_sizes={"actor_train": 2},
    )
    yield _start_role(
        ActorWorker,
        plan,
        "actor_train",
        model_dir,
        RANK_ARGS,
        total_train_steps=4,
        seed=7,
        strategy_name="fsdp2",
        strategy_config={},
    )
    ray.shutdown()


def _three_steps(actor, sizes=(8, 8, 7), old: bool = True, first_step: int = 0) -> tuple[list[dict], dict]:
    """ppo_cases' PPO step on 8 rows twice, then on 7: that step's second mini-batch (3 rows) gives
    rank 0 two micro-batches and rank 1 one, so rank 1 must pad its passes to join FSDP2's
    collectives; the 7-row log-probs split 4/3, unequal forwards too. `old=False`: the actor takes
    the old log-probs itself."""
    metrics = [
        actor.train(
            ppo_batch(actor, n, old=old),
            PolicyLossOptions(entropy_coef=0.01),
            ppo_epochs=2,
            step=step,
        )
        for step, n in enumerate(sizes, start=first_step)
    ]
    return metrics, actor.get_weights()


def test_two_ranks_train_like_one_process(fsdp2_ranks, model_dir, tmp_path):
    group = fsdp2_ranks
    assert isinstance(group, RankGroup) and len(group.handles) == 2
    one_process = ActorWorker(model_dir, ARGS, total_train_steps=4, seed=7, num_threads=1)
    batch = ppo_batch(_GroupActor(group))
    torch.testing.assert_close(batch["old_logprobs"], one_process.compute_logprobs(batch, 1.0), **WEIGHT_TOL)
    first = next(shuffled_minibatches(batch, 4, 7, "minibatch", 0, 0))  # the first step's first mini-batch
    shares = [first["response_mask"][rows].sum().item() for rows in (slice(0, 2), slice(2, 4))]
    assert shares[0] != shares[1]  # the ranks' token counts differ, so the global count matters
    got = _three_steps(_GroupActor(group))
    assert_same_training(got, _three_steps(one_process))
    ray.get(group.save_checkpoint.remote(str(tmp_path)))  # a collective; rank 0 writes the HF dir
    for key, value in load_file(tmp_path / "model.safetensors").items():
        torch.testing.assert_close(value, got[1][key], rtol=0, atol=0, msg=key)


def test_two_ranks_take_old_logprobs_in_training_like_one_process_given_them(fsdp2_ranks, model_dir, tmp_path):
    """From one checkpoint: the ranks take the old log-probs in `train` (each its share of the
    first mini-batch, its slice of the other rows, then summed); one process is given them by a
    pass. Steps of 8, 5 and 7 rows: 5 leaves one row outside the first mini-batch, so rank 1 has no
    slice and joins FSDP2's forward with a stand-in."""
    group = fsdp2_ranks
    ray.get(group.save_checkpoint.remote(str(tmp_path)))
    one_process = ActorWorker(model_dir, ARGS, total_train_steps=4, seed=7, num_threads=1)
    one_process.load_checkpoint(str(tmp_path))
    got = _three_steps(_GroupActor(group), (8, 5, 7), old=False, first_step=3)
    assert_same_training(got, _three_steps(one_process, (8, 5, 7), first_step=3))
    assert all(m["rollout/logprob_abs_diff"] == pytest.approx(0.01, abs=1e-6) for m in got[0])
