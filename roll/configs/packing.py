"""ROLL's `sequence_packing_args` of a training role (`use_sequence_packing`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from roll.configs.base import ConfigModel


class SequencePackingArgs(ConfigModel):
    """How a role's micro-batches are planned when `use_sequence_packing` runs them as packed rows
    (`roll.distributed.sequence_packing`)."""

    algorithm: Literal["none", "load_balance"] = "none"
    """"none": the usual micro-batches (`per_device_train_batch_size` / `infer_batch_size` rows, or
    dynamic batching's token bins), each packed. "load_balance": micro-batches of balanced workload
    (Karmarkar-Karp over ROLL's FLOP proxy), ceil(tokens / max_packed_sequence_length_*) of them at
    least, and a training mini-batch's rows spread over data-parallel ranks by workload, as ROLL."""
    max_packed_sequence_length_forward: int | None = Field(None, ge=1)
    """load_balance: target tokens of one packed micro-batch in log-prob / value passes."""
    max_packed_sequence_length_train: int | None = Field(None, ge=1)
    """load_balance: target tokens of one packed training micro-batch."""
    min_num_micro_batches_forward: int = Field(1, ge=1)
    """load_balance: at least this many micro-batches in a forward pass."""
    min_num_micro_batches_train: int = Field(1, ge=1)
    """load_balance: at least this many micro-batches per optimizer step."""

    def plan(self, phase: Literal["train", "forward"]) -> dict | None:
        """`PackingBudget` arguments of `phase` under load_balance; None with "none"."""
        if self.algorithm != "load_balance":
            return None
        return {
            "max_tokens": getattr(self, f"max_packed_sequence_length_{phase}"),
            "min_micro_batches": getattr(self, f"min_num_micro_batches_{phase}"),
            "key": f"sequence_packing_args.max_packed_sequence_length_{phase}",
        }
