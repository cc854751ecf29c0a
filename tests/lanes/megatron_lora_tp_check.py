"""Lane check (run by .ci/run_megatron_tp, not collected by pytest: two processes): LoRA on megatron
at tensor parallel 2 (gloo, CPU) trains like one process at TP 1.

Two PPO steps (ppo_cases) with adapters on every linear: the same losses and gradient norms (the
norm sums the squares of the sharded adapter pieces over the ranks), the same merged HF weights
(ppo_cases.WEIGHT_TOL), the same `model/*_params` counts; on each rank only adapter pieces moved.
The TP-2 checkpoint's adapter (gathered from the shards, written as a peft adapter) equals TP 1's,
and a TP-2 strategy resumed from it takes the same third step as the one that wrote it.
TP 1 itself is checked by hand in tests/distributed/test_megatron_lora.py.

    python tests/lanes/megatron_lora_tp_check.py MODEL_DIR
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
from roll.distributed.strategies.process_group import ensure_process_group, free_port  # noqa: E402
from roll.distributed.workers.actor import ActorWorker  # noqa: E402
from tests.distributed.ppo_cases import ARGS, assert_same_training, ppo_batch  # noqa: E402

LORA = {"rank": 4, "alpha": 8, "target": "all-linear"}
TP2 = {"tensor_model_parallel_size": 2}


def _actor(model_dir: str, config: dict) -> ActorWorker:
    return ActorWorker(
        model_dir,
        ARGS,
        total_train_steps=4,
        seed=7,
        num_threads=1,
        strategy_name="megatron",
        strategy_config=config,
        features={"lora": LORA},
    )


def _step(actor: ActorWorker, step: int) -> dict:
    return actor.train(
        ppo_batch(actor),
        PolicyLossOptions(entropy_coef=0.01),
        ppo_epochs=2,
        step=step,
    )


def run(model_dir: str, config: dict, checkpoint: str) -> dict:
    """Two steps, a checkpoint, a third step; then a fresh strategy resumed from the checkpoint
    takes the third step again. What the rank saw, as plain tensors and numbers."""
    actor = _actor(model_dir, config)
    before = {n: p.detach().clone() for n, p in actor.strategy.gpt.named_parameters()}
    metrics = [_step(actor, step) for step in range(2)]
    changed = sorted(n for n, p in actor.strategy.gpt.named_parameters() if not torch.equal(p, before[n]))
    weights = actor.get_weights()
    actor.save_checkpoint(checkpoint)
    third = _step(actor, 2)
    resumed = _actor(model_dir, config)
    resumed.load_checkpoint(checkpoint)
    return {
        "metrics": metrics,
        "weights": weights,
        "changed": changed,
        "third": third,
        "resumed_third": _step(resumed, 2),
        "counts": actor.param_counts(),
        "adapters": sorted(n for n in before if n.endswith((".lora_A", ".lora_B"))),
    }


def _rank(rank: int, model_dir: str, port: int, out_dir: str) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    ensure_process_group(torch.device("cpu"))
    torch.save(run(model_dir, TP2, os.path.join(out_dir, "ckpt")), os.path.join(out_dir, f"rank{rank}.pt"))


def assert_same_lora_training(results: list[dict], want: dict, checkpoint: str, want_checkpoint: str) -> None:
    """Every rank's `run` equals one process's `want` (module docstring); `checkpoint`'s adapter
    (written by the ranks) equals `want_checkpoint`'s and its merged weights are rank 0's."""
    from peft.utils import load_peft_weights
    from transformers import AutoModelForCausalLM

    want_adapter = load_peft_weights(os.path.join(want_checkpoint, "adapter"), device="cpu")
    got_adapter = load_peft_weights(os.path.join(checkpoint, "adapter"), device="cpu")
    merged = AutoModelForCausalLM.from_pretrained(checkpoint).state_dict()
    assert want["changed"] == want["adapters"]
    for got in results:
        assert got["changed"] == got["adapters"], got["changed"]  # only adapter pieces moved, all of them
        assert got["counts"] == want["counts"], (got["counts"], want["counts"])
        assert_same_training((got["metrics"], got["weights"]), (want["metrics"], want["weights"]))
        for key in ("losses/policy_loss", "actor/grad_norm"):
            assert got["resumed_third"][key] == got["third"][key], key  # resume: bit for bit
            assert abs(got["third"][key] - want["third"][key]) <= 1e-4 * abs(want["third"][key]) + 1e-6, key
    assert got_adapter.keys() == want_adapter.keys()
    for key, value in want_adapter.items():
        torch.testing.assert_close(got_adapter[key], value, rtol=1e-4, atol=1e-4, msg=key)
    for key, value in results[0]["weights"].items():
        assert torch.equal(merged[key], value), key


def main(model_dir: str) -> None:
    with tempfile.TemporaryDirectory() as out_dir:
        want = run(model_dir, {}, os.path.join(out_dir, "ckpt1"))
        mp.spawn(_rank, args=(model_dir, free_port(), out_dir), nprocs=2, join=True)
        results = [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=True) for r in range(2)]
        assert_same_lora_training(results, want, os.path.join(out_dir, "ckpt"), os.path.join(out_dir, "ckpt1"))
    counts = want["counts"]
    print(
        f"megatron LoRA TP 2 equals TP 1 (losses, grad norms, merged weights, adapter, resume): ok; "
        f"trainable/total = {counts['model/trainable_params']:.0f}/{counts['model/total_params']:.0f}"
    )


if __name__ == "__main__":
    main(sys.argv[1])
