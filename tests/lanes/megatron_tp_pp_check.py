"""Lane check (run by .ci/run_megatron_tp, not collected by pytest: 4 processes on the shared 2-core
machine are too slow for CI): megatron at tensor parallel 2 x pipeline parallel 2 over four CPU
processes (gloo) trains two PPO steps (ppo_cases) like megatron in one process (TP 1, PP 1): same
losses and gradient norms, weights to ppo_cases.WEIGHT_TOL, on the tiny Llama and on a copy with
tied embeddings (vocabulary-parallel embedding on stage 0, its copy on stage 1, gradients summed per
tensor-parallel rank). Processes r = 0..3 are (tp, pp) ranks (0, 0), (1, 0), (0, 1), (1, 1): megatron's
"tp-cp-ep-dp-pp" order, stages outermost, all four one data-parallel rank (same rows). Then pipeline
parallel 2 x data parallel 2 (each data-parallel rank on half of every mini-batch) against one
process on the whole mini-batch: processes are (pp, dp) (0, 0), (0, 1), (1, 0), (1, 1), the
data-parallel ranks `roll.distributed.ranks.data_parallel_ranks` hands rows by.

    python tests/lanes/megatron_tp_pp_check.py MODEL_DIR
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for tests.*
from roll.distributed.ranks import data_parallel_ranks  # noqa: E402
from roll.distributed.strategies.process_group import ensure_process_group, free_port  # noqa: E402
from tests.distributed.ppo_cases import ARGS, WEIGHT_TOL, assert_same_training, train_two_steps  # noqa: E402
from tests.lanes.megatron_tp_dp_check import RANK_ARGS, two_steps  # noqa: E402

TP2_PP2 = {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2}
PP2 = {"pipeline_model_parallel_size": 2}


def tied_copy(model_dir: str, out_dir: str) -> str:
    """A model of `model_dir`'s shape with lm_head tied to the embedding (random, seed 3)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    config.tie_word_embeddings = True
    torch.manual_seed(3)
    path = os.path.join(out_dir, "tied")
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


def _layout() -> tuple[int, int, int]:
    from roll.distributed.strategies.megatron.model import parallel_state

    return (
        parallel_state.get_tensor_model_parallel_rank(),
        parallel_state.get_pipeline_model_parallel_rank(),
        parallel_state.get_data_parallel_rank(),
    )


def _rank(rank: int, model_dirs: list[str], port: int, out_dir: str) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="4", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    ensure_process_group(torch.device("cpu"))
    runs = [train_two_steps(model_dir, "megatron", TP2_PP2) for model_dir in model_dirs]
    torch.save({"runs": runs, "layout": _layout()}, os.path.join(out_dir, f"rank{rank}.pt"))


def _data_parallel_rank(rank: int, model_dir: str, port: int, out_dir: str) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="4", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    ensure_process_group(torch.device("cpu"))
    metrics, weights, _ = two_steps(model_dir, RANK_ARGS, "megatron", PP2)
    torch.save({"run": (metrics, weights), "layout": _layout()}, os.path.join(out_dir, f"dp{rank}.pt"))


def _largest_differences(got, want) -> tuple[float, float]:
    """The largest |difference| of the policy loss and of the gradient norm over the steps."""
    pairs = list(zip(got[0], want[0], strict=True))
    return (
        max(abs(g["losses/policy_loss"] - w["losses/policy_loss"]) for g, w in pairs),
        max(abs(g["actor/grad_norm"] - w["actor/grad_norm"]) for g, w in pairs),
    )


def main(model_dir: str) -> None:
    from roll.distributed.strategies.megatron import model as megatron_model

    with tempfile.TemporaryDirectory() as out_dir:
        model_dirs = [model_dir, tied_copy(model_dir, out_dir)]
        mp.spawn(_rank, args=(model_dirs, free_port(), out_dir), nprocs=4, join=True)
        results = [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=True) for r in range(4)]
        ensure_process_group(torch.device("cpu"))
        megatron_model.init_model_parallel()
        wants = [train_two_steps(path, "megatron") for path in model_dirs]
        mp.spawn(_data_parallel_rank, args=(model_dir, free_port(), out_dir), nprocs=4, join=True)
        dp_results = [torch.load(os.path.join(out_dir, f"dp{r}.pt"), weights_only=True) for r in range(4)]
        dp_want = two_steps(model_dir, ARGS, "megatron", {})[:2]
    assert [r["layout"] for r in results] == [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0)], results
    for name, want, runs in zip(("llama", "tied llama"), wants, zip(*(r["runs"] for r in results)), strict=True):
        for got in runs:
            assert_same_training(got, want)
        diffs = [_largest_differences(got, want) for got in runs]
        loss_diff, norm_diff = max(d[0] for d in diffs), max(d[1] for d in diffs)
        print(
            f"{name}: grad norms {[round(m['actor/grad_norm'], 6) for m in want[0]]}, largest |TP2xPP2 - 1 "
            f"process| policy loss {loss_diff:.2e}, grad norm {norm_diff:.2e}"
        )
    print(f"megatron TP 2 x PP 2 equals one process (weights to {WEIGHT_TOL}): ok")
    layouts = [r["layout"] for r in dp_results]
    assert layouts == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)], layouts
    assert [dp for _, _, dp in layouts] == data_parallel_ranks(4, 1, 2)
    for result in dp_results:
        assert_same_training(result["run"], dp_want)
    loss_diff, norm_diff = (
        max(_largest_differences(r["run"], dp_want)[0] for r in dp_results),
        max(_largest_differences(r["run"], dp_want)[1] for r in dp_results),
    )
    print(
        f"megatron PP 2 x DP 2 equals one process on the whole mini-batch: largest |difference| policy loss "
        f"{loss_diff:.2e}, grad norm {norm_diff:.2e}: ok"
    )


if __name__ == "__main__":
    main(sys.argv[1])
