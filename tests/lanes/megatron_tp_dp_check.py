"""Lane check (run by .ci/run_megatron_tp, not collected by pytest: 4 processes, ~3 min on the
shared 2-core machine): megatron at TP 2 x DP 2 over four CPU processes (gloo) trains two PPO
steps (ppo_cases) like one process with the torch strategy on the whole mini-batch: same losses
and gradient norms, weights to ppo_cases.WEIGHT_TOL, and processes r = 0..3 are (tp, dp) ranks
(0, 0), (1, 0), (0, 1), (1, 1), megatron's "tp-...-dp" order that roll.distributed.ranks assumes.

    python tests/lanes/megatron_tp_dp_check.py MODEL_DIR
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for tests.*
from roll.algorithms.actor_loss import PolicyLossOptions  # noqa: E402
from roll.configs.worker import TrainingArgs  # noqa: E402
from roll.distributed.strategies.process_group import ensure_process_group, free_port  # noqa: E402
from roll.distributed.workers.actor import ActorWorker  # noqa: E402
from tests.distributed.ppo_cases import ARGS, WEIGHT_TOL, assert_same_training, ppo_batch  # noqa: E402

# per data-parallel rank half of ARGS's 4-row mini-batch, so two data-parallel ranks step on 4 rows
RANK_ARGS = TrainingArgs(
    learning_rate=ARGS.learning_rate,
    per_device_train_batch_size=1,
    gradient_accumulation_steps=2,
    max_grad_norm=ARGS.max_grad_norm,
)


def two_steps(model_dir: str, args: TrainingArgs, name: str, config: dict):
    actor = ActorWorker(
        model_dir, args, total_train_steps=4, seed=7, num_threads=1, strategy_name=name, strategy_config=config
    )
    metrics = [
        actor.train(
            ppo_batch(actor),
            PolicyLossOptions(entropy_coef=0.01),
            ppo_epochs=2,
            step=step,
        )
        for step in range(2)
    ]
    strategy = actor.strategy
    return metrics, actor.get_weights(), (strategy.tp_rank, strategy.dp_rank) if name == "megatron" else None


def _rank(rank: int, model_dir: str, port: int, out_dir: str) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="4", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    ensure_process_group(torch.device("cpu"))
    torch.save(
        two_steps(model_dir, RANK_ARGS, "megatron", {"tensor_model_parallel_size": 2}),
        os.path.join(out_dir, f"rank{rank}.pt"),
    )


def main(model_dir: str) -> None:
    want_metrics, want_weights, _ = two_steps(model_dir, ARGS, "torch", {})
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(_rank, args=(model_dir, free_port(), out_dir), nprocs=4, join=True)
        results = [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=True) for r in range(4)]
    assert [layout for _, _, layout in results] == [(0, 0), (1, 0), (0, 1), (1, 1)], results
    for metrics, weights, _ in results:
        assert_same_training((metrics, weights), (want_metrics, want_weights))
    print(f"megatron TP 2 x DP 2 equals one process (weights to {WEIGHT_TOL}): ok")


if __name__ == "__main__":
    main(sys.argv[1])
