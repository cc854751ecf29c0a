"""Sequence packing on the `megatron` strategy (CPU, real megatron-core): a micro-batch's rows run
as one row in megatron's "thd" format (roll.distributed.strategies.megatron.model.packed_sequences)
and give the padded numbers up to float round-off:
- log-probs, entropies and every gradient of one forward and backward on a mixed-length batch (a
  one-token row included), and the HF model's log-probs;
- two PPO steps (packed old log-probs, 2 epochs x 2 mini-batches x 2 packed micro-batches; then
  ROLL's load-balanced plan): the padded torch run's losses, gradient norms and weights;
- the same at tensor parallel 2, at pipeline parallel 2 and at data parallel 2 with ROLL's
  load-balanced plan spreading rows over the ranks (two CPU processes, gloo);
- recomputation changes no gradient of a packed step;
- what packed rows refuse, in one line: labels, an attention mask, positions of no packed row.
The config side (megatron accepts `use_sequence_packing`; context and sequence parallel are still
refused by name) is in tests/configs/test_sequence_packing_config.py."""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp
from ppo_cases import ARGS, assert_same_training, lm_minibatch, padded_and_packed, train_two_steps
from torch.testing import assert_close
from transformers import AutoModelForCausalLM

from roll.distributed.micro_batches import token_logprobs
from roll.distributed.sequence_packing import PackingBudget
from roll.distributed.strategies.process_group import ensure_process_group, free_port
from roll.distributed.strategies.registry import build_train_strategy

pytest.importorskip("megatron.core", reason="needs megatron-core (the test extra installs it)")
from roll.distributed.strategies.megatron import model as megatron_model  # noqa: E402  (imports megatron-core)
from roll.distributed.strategies.megatron.convert import arch_from_hf, hf_to_megatron  # noqa: E402

torch.set_num_threads(1)
LENGTHS = [9, 3, 6, 1, 7]  # right-padded to 9; one row of a single token
PACKED = {"sequence_packing": True}
PLAN = PackingBudget(max_tokens=12, min_micro_batches=1)  # 4 rows of 6..9 tokens: 3 micro-batches
LOAD_BALANCED = PACKED | {"train_budget": PLAN, "infer_budget": PLAN}
LAYOUTS = {  # two processes: strategy_config, features
    "tp2": ({"tensor_model_parallel_size": 2}, PACKED),
    "pp2": ({"pipeline_model_parallel_size": 2}, PACKED),
    "dp2": ({}, LOAD_BALANCED),  # ROLL's batch_balance: each rank's rows by workload, then packed
    "dp2_padded": ({}, {}),  # what dp2 compares with: a mini-batch is per-rank rows x 2 ranks
}


@pytest.fixture(scope="module")
def megatron_groups():
    """The one-process default group and megatron's groups over it (shared with the strategy)."""
    ensure_process_group(torch.device("cpu"))
    megatron_model.init_model_parallel()


@pytest.fixture(scope="module")
def padded_run(model_dir):
    return train_two_steps(model_dir, "torch")


def ragged() -> tuple[torch.Tensor, torch.Tensor]:
    mask = (torch.arange(9)[None, :] < torch.tensor(LENGTHS)[:, None]).long()
    ids = torch.randint(1, 32, (len(LENGTHS), 9), generator=torch.Generator().manual_seed(0))
    return ids * mask, mask


def test_packed_logprobs_entropies_and_gradients_equal_padded(model_dir, megatron_groups):
    hf = AutoModelForCausalLM.from_pretrained(model_dir)
    arch = arch_from_hf(hf.config)
    gpt = megatron_model.build_gpt_model(arch, torch.float32)
    megatron_model.load_megatron_state(gpt, hf_to_megatron(hf.state_dict(), arch))
    model = megatron_model.MegatronCausalLM(gpt, arch.vocab_size)
    ids, mask = ragged()
    (padded_lp, padded_h, padded_g), (packed_lp, packed_h, packed_g) = padded_and_packed(model, ids, mask)
    assert_close(packed_lp, padded_lp, rtol=1e-5, atol=1e-5)
    assert_close(packed_h, padded_h, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        hf_lp, _ = token_logprobs(hf, ids, mask, temperature=0.7, dedupe=False)
    assert_close(packed_lp, hf_lp, rtol=1e-5, atol=1e-5)
    assert (packed_lp[mask == 0] == 0).all() and packed_lp[2, 1:6].ne(0).all()
    for name, grad in padded_g.items():
        assert_close(packed_g[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_packed_sequences_by_hand():
    packed = megatron_model.packed_sequences(torch.tensor([[0, 1, 2, 0, 0, 1]]))
    assert packed.qkv_format == "thd" and packed.cu_seqlens_q.tolist() == [0, 3, 4, 6]
    assert packed.max_seqlen_q == packed.max_seqlen_kv == 3 and packed.cu_seqlens_q.dtype == torch.int32


def test_the_packed_row_run_as_one_sequence_gives_other_logits(model_dir, megatron_groups):
    """The equality above can fail: the same packed row without its positions (one sequence of
    N tokens, attention across rows) changes every row's logits but the first's."""
    hf = AutoModelForCausalLM.from_pretrained(model_dir)
    arch = arch_from_hf(hf.config)
    gpt = megatron_model.build_gpt_model(arch, torch.float32)
    megatron_model.load_megatron_state(gpt, hf_to_megatron(hf.state_dict(), arch))
    model = megatron_model.MegatronCausalLM(gpt, arch.vocab_size).eval()
    ids, mask = ragged()
    row = ids[mask.bool()][None]
    positions = torch.cat([torch.arange(n) for n in LENGTHS])[None]
    with torch.no_grad():
        per_sequence = model(input_ids=row, position_ids=positions).logits[0]
        one_sequence = model(input_ids=row).logits[0]
    assert_close(per_sequence[:9], one_sequence[:9], rtol=0, atol=1e-6)  # the first row sees only itself
    assert (per_sequence[9:] - one_sequence[9:]).abs().amax(-1).min() > 1e-4


def test_packed_ppo_steps_match_padded_ones(model_dir, megatron_groups, padded_run):
    """Two PPO steps (old log-probs from a packed forward, 2 epochs x 2 mini-batches x 2 packed
    micro-batches): the losses, gradient norms and weights of the padded torch run."""
    assert_same_training(train_two_steps(model_dir, "megatron", None, PACKED), padded_run)


def test_load_balanced_packed_micro_batches_match_padded_ones(model_dir, megatron_groups, padded_run):
    assert_same_training(train_two_steps(model_dir, "megatron", None, LOAD_BALANCED), padded_run)


def _packed_strategy(model_dir: str, **config):
    return build_train_strategy(
        AutoModelForCausalLM.from_pretrained(model_dir), ARGS, strategy_name="megatron", strategy_config=config,
        total_steps=4, metric_prefix="actor", sequence_packing=True,
    )  # fmt: skip


def _packed_nll(model, micro):
    logprobs, _ = token_logprobs(model, micro["input_ids"], micro["attention_mask"], 1.0)
    return -(logprobs * micro["response_mask"]).sum() / micro["response_mask"].sum(), {}


def _ragged_minibatch():
    batch = lm_minibatch(0)
    batch["attention_mask"][1, 5:] = 0  # rows of 8, 5, 8, 3 tokens
    batch["attention_mask"][3, 3:] = 0
    batch["response_mask"] = batch["attention_mask"].float()
    return batch


@pytest.mark.parametrize("granularity", ["full", "selective"])
def test_recomputation_changes_no_gradient_of_a_packed_step(model_dir, megatron_groups, granularity):
    want = _packed_strategy(model_dir).train_step(_ragged_minibatch(), _packed_nll)["actor/grad_norm"]
    strategy = _packed_strategy(model_dir, recompute_granularity=granularity)
    assert strategy.train_step(_ragged_minibatch(), _packed_nll)["actor/grad_norm"] == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ({"position_ids": torch.tensor([[0, 1, 0]]), "labels": torch.ones(1, 3, dtype=torch.long)}, "neither"),
        ({"position_ids": torch.tensor([[0, 1, 0]]), "attention_mask": torch.ones(1, 3)}, "neither"),
        ({"position_ids": torch.tensor([[0, 1, 2], [0, 1, 2]])}, "one packed row"),
        ({"position_ids": torch.tensor([[1, 2, 3]])}, "one packed row"),
        ({"position_ids": torch.tensor([[0, 1, 3]])}, "count 0, 1, 2"),
    ],
)
def test_what_packed_rows_refuse_is_named_in_one_line(model_dir, megatron_groups, call, message):
    hf = AutoModelForCausalLM.from_pretrained(model_dir)
    arch = arch_from_hf(hf.config)
    model = megatron_model.MegatronCausalLM(megatron_model.build_gpt_model(arch, torch.float32), arch.vocab_size)
    ids = torch.ones_like(call["position_ids"])
    with pytest.raises(ValueError, match=f"^position_ids: .*{message}"):
        model(input_ids=ids, **call)


# ---- two processes: tensor parallel 2, pipeline parallel 2 -----------------------------------
def _rank(rank: int, model_dir: str, port: int, out_dir: str) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    ensure_process_group(torch.device("cpu"))
    runs = {}
    for name, (config, features) in LAYOUTS.items():  # megatron keeps one layout per process: new groups each
        runs[name] = train_two_steps(model_dir, "megatron", config, features)
        megatron_model.parallel_state.destroy_model_parallel()
    torch.save(runs, os.path.join(out_dir, f"rank{rank}.pt"))


@pytest.fixture(scope="module")
def two_ranks(model_dir, tmp_path_factory) -> list[dict]:
    out_dir = tmp_path_factory.mktemp("megatron_packing")
    mp.spawn(_rank, args=(model_dir, free_port(), str(out_dir)), nprocs=2, join=True)
    return [torch.load(out_dir / f"rank{rank}.pt", weights_only=True) for rank in range(2)]


@pytest.mark.parametrize("layout", ["tp2", "pp2"])
def test_packed_ppo_steps_at_two_ranks_match_one_padded_process(two_ranks, padded_run, layout):
    """Both tensor-parallel ranks (one data-parallel rank) or both stages pack the same rows:
    every rank reports the padded one-process run's losses, gradient norms and merged weights."""
    for runs in two_ranks:
        assert_same_training(runs[layout], padded_run)


def test_load_balanced_data_parallel_ranks_match_padded_ones(two_ranks):
    """Two data-parallel ranks, each packing the rows ROLL's load balance gives it: the losses,
    gradient norms and weights of the same two ranks padded (ROLL's mini-batch is per-rank rows
    times ranks, so one process would take other steps)."""
    for runs in two_ranks:
        assert_same_training(runs["dp2"], runs["dp2_padded"])
