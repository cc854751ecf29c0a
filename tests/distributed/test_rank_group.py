"""Two FSDP2 ranks of `actor_train` as the pipeline starts them (two Ray actors, one gloo group,
`builders._start_role`) and calls them (`RankGroup`): old log-probs split by rows and merged, then
two PPO steps whose response-token counts differ between the ranks' shares, equal one process
training the whole batch with the torch strategy (ppo_cases.py: same losses, gradient norms,
weights); the checkpoint, a collective, is written whole by rank 0."""

from __future__ import annotations

import pytest
import ray
import torch
from safetensors.torch import load_file

from roll.configs.worker import TrainingArgs
from roll.distributed.placement import plan_devices
from roll.distributed.rank_group import RankGroup
from roll.distributed.workers.actor import ActorWorker
from roll.distributed.workers.common import shuffled_minibatches
from roll.pipeline.builders import _start_role

from ppo_cases import ARGS, WEIGHT_TOL, assert_same_training, ppo_batch, train_two_steps

# Per rank: micro-batches of 1, 2 of them; over 2 ranks the mini-batch is ARGS's 4 rows.
RANK_ARGS = TrainingArgs(learning_rate=ARGS.learning_rate, per_device_train_batch_size=1,
                         gradient_accumulation_steps=2, max_grad_norm=ARGS.max_grad_norm)


class _Logprobs:
    """`ppo_batch` asks its actor for old log-probs; here they come from the group."""

    def __init__(self, group: RankGroup):
        self.group = group

    def compute_logprobs(self, batch, temperature):
        return ray.get(self.group.compute_logprobs.remote(batch, temperature))


@pytest.fixture(scope="module")
def fsdp2_ranks(model_dir):
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    plan = plan_devices({"actor_train": None}, strategies={"actor_train": "fsdp2"}, inference_replicas=1,
                        visible_gpus=0, world_sizes={"actor_train": 2})
    yield _start_role(ActorWorker, plan, "actor_train", model_dir, RANK_ARGS, total_train_steps=4, seed=7,
                      strategy_name="fsdp2", strategy_config={})
    ray.shutdown()


def test_two_ranks_train_like_one_process(fsdp2_ranks, model_dir, tmp_path):
    group = fsdp2_ranks
    assert isinstance(group, RankGroup) and len(group.handles) == 2
    one_process = ActorWorker(model_dir, ARGS, total_train_steps=4, seed=7, num_threads=1)
    batch = ppo_batch(_Logprobs(group))
    torch.testing.assert_close(batch["old_logprobs"], one_process.compute_logprobs(batch, 1.0), **WEIGHT_TOL)
    first = next(shuffled_minibatches(batch, 4, 7, "minibatch", 0, 0))  # the first step's first mini-batch
    shares = [first["response_mask"][rows].sum().item() for rows in (slice(0, 2), slice(2, 4))]
    assert shares[0] != shares[1]  # the ranks' token counts differ, so the global count matters
    metrics = [ray.get(group.train.remote(ppo_batch(_Logprobs(group)), temperature=1.0, ppo_epochs=2, pg_clip=0.2,
                                          entropy_loss_coef=0.01, loss_agg_mode="token-mean", step=step))
               for step in range(2)]
    weights = ray.get(group.get_weights.remote())
    assert_same_training((metrics, weights), train_two_steps(model_dir, "torch"))
    ray.get(group.save_checkpoint.remote(str(tmp_path)))
    saved = load_file(tmp_path / "model.safetensors")
    for key, value in saved.items():
        torch.testing.assert_close(value, weights[key], rtol=0, atol=0, msg=key)
