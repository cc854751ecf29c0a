"""How data-parallel ranks share a batch (roll.distributed.ranks), against hand-derived numbers:
row slices and their merge, and the weighting of each rank's micro-batches against the WHOLE
mini-batch when the ranks hold different numbers of response tokens."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from roll.distributed.ranks import merge_rows, micro_weights, rank_input, rank_share, split_rows

# Four rows with 4, 1, 2 and 1 response tokens; every token of a row has the row's loss value.
TOKENS = [4, 1, 2, 1]
LOSS = [1.0, 5.0, 2.0, 8.0]
# One process, token-mean over the mini-batch: (4*1 + 1*5 + 2*2 + 1*8) / 8 tokens.
WHOLE_MEAN = 21 / 8


def minibatch() -> TensorDict:
    positions = torch.arange(5)
    mask = torch.stack([(positions < n).float() for n in TOKENS])
    return TensorDict(
        {"response_mask": mask, "loss": torch.tensor(LOSS)[:, None] * mask, "row": torch.arange(4)}, batch_size=[4]
    )


@pytest.mark.parametrize(
    ("rows", "ranks", "expected"),
    [
        (8, 2, [(0, 4), (4, 8)]),
        (5, 2, [(0, 3), (3, 5)]),
        (7, 3, [(0, 3), (3, 5), (5, 7)]),
        (1, 3, [(0, 1), (1, 1), (1, 1)]),
        (0, 2, [(0, 0), (0, 0)]),
    ],
)
def test_split_rows_is_contiguous_and_near_equal(rows, ranks, expected):
    assert [(s.start, s.stop) for s in split_rows(rows, ranks)] == expected


def test_merge_puts_rank_outputs_back_in_row_order_and_drops_stand_ins():
    batch = TensorDict({"x": torch.arange(3)[:, None].float()}, batch_size=[3])
    slices = split_rows(3, 4)  # ranks 0-2 one row each, rank 3 none
    inputs = [rank_input(batch, rows) for rows in slices]
    assert [len(i) for i in inputs] == [1, 1, 1, 1] and inputs[3]["x"].item() == 0  # stand-in: row 0
    outputs = [i["x"] * 10 for i in inputs]
    merged = merge_rows(outputs, [s.stop - s.start for s in slices])
    assert merged[:, 0].tolist() == [0.0, 10.0, 20.0]


def test_rank_micro_weights_use_the_whole_minibatch_token_count():
    """Rank 0 holds rows 0-1 (5 tokens), rank 1 rows 2-3 (3 tokens); 8 in all. One row per
    micro-batch: weight = row tokens / 8, times 2 because the engine averages the two ranks."""
    shares = [rank_share(minibatch(), rank, 2, "tokens") for rank in range(2)]
    assert [share["row"].tolist() for share, _ in shares] == [[0, 1], [2, 3]]
    assert [total for _, total in shares] == [8.0, 8.0]
    weights = [
        micro_weights([share[i : i + 1] for i in range(2)], "tokens", total, world_size=2) for share, total in shares
    ]
    assert weights == [[1.0, 0.25], [0.5, 0.25]]
    # each micro-batch's loss is its token-mean; the engine averages the ranks' weighted sums
    means = [LOSS[0], LOSS[1]], [LOSS[2], LOSS[3]]
    per_rank = [sum(w * m for w, m in zip(ws, ms, strict=True)) for ws, ms in zip(weights, means, strict=True)]
    assert per_rank == [2.25, 3.0] and sum(per_rank) / 2 == WHOLE_MEAN
    # weighting each rank by its own tokens gives the mean of the ranks' means instead: 2.9
    local = [micro_weights([share[i : i + 1] for i in range(2)], "tokens") for share, _ in shares]
    assert local == [[0.8, 0.2], [2 / 3, 1 / 3]]
    assert sum(
        sum(w * m for w, m in zip(ws, ms, strict=True)) for ws, ms in zip(local, means, strict=True)
    ) / 2 == pytest.approx(2.9)


def test_row_weights_count_rows_with_a_response():
    batch = minibatch()
    batch["response_mask"][1] = 0  # row 1 has no response token: left out of sequence means
    share, total = rank_share(batch, 0, 2, "rows")
    assert total == 3.0
    assert micro_weights([share[:1], share[1:]], "rows", total, world_size=2) == [2 / 3, 0.0]


def test_one_process_weights_are_unchanged():
    """world_size 1, no total: each micro-batch's share of the mini-batch's own tokens."""
    batch = minibatch()
    assert micro_weights([batch[:2], batch[2:]], "tokens") == [5 / 8, 3 / 8]
    assert micro_weights([batch[:1], batch[1:]], "rows") == [1 / 4, 3 / 4]


def test_a_rank_without_rows_gets_a_stand_in_that_weighs_nothing():
    share, total = rank_share(minibatch()[:1], 1, 2, "tokens")
    assert share["row"].tolist() == [0] and share["response_mask"].sum() == 0 and total == 4.0
    assert micro_weights([share], "tokens", total, world_size=2) == [0.0]


# ---- model-parallel processes of one data-parallel rank ----------------------------------------
def test_data_parallel_ranks_follow_megatrons_tp_first_order():
    from roll.distributed.ranks import data_parallel_ranks

    assert data_parallel_ranks(4) == [0, 1, 2, 3]
    assert data_parallel_ranks(2, tensor_parallel=2) == [0, 0]
    assert data_parallel_ranks(4, tensor_parallel=2) == [0, 0, 1, 1]
    assert data_parallel_ranks(4, pipeline_parallel=2) == [0, 1, 0, 1]  # "tp-cp-ep-dp-pp": pp outermost
    assert data_parallel_ranks(8, tensor_parallel=2, pipeline_parallel=2) == [0, 0, 1, 1, 0, 0, 1, 1]


def test_rank_group_gives_every_process_of_a_data_parallel_rank_the_same_rows(monkeypatch):
    """TP 2 x DP 2: processes 0, 1 get rows 0-2, processes 2, 3 rows 3-4; the merge keeps the
    output of processes 0 and 2 and waits on all four."""
    from roll.distributed import rank_group

    class Handle:
        def __init__(self, rank):
            self.compute_logprobs = rank_group._Method(lambda batch, t: batch["input_ids"] * 10 + rank)

    class Merge:  # rank_group._merge_rows without Ray: the refs are the outputs themselves
        @staticmethod
        def remote(row_counts, keep, *parts):
            assert len(parts) == 4
            return rank_group.merge_rows([parts[i] for i in keep], row_counts)

    monkeypatch.setattr(rank_group, "_merge_rows", Merge)
    group = rank_group.RankGroup([Handle(r) for r in range(4)], data_ranks=[0, 0, 1, 1])
    batch = TensorDict({"input_ids": torch.arange(5)[:, None]}, batch_size=[5])
    merged = group.compute_logprobs.remote(batch, 1.0)
    assert merged[:, 0].tolist() == [0, 10, 20, 32, 42]  # rows 0-2 from process 0, rows 3-4 from process 2
