"""Reference role: the frozen initial policy whose log-probs anchor the KL penalty."""

from __future__ import annotations

from typing import cast

import torch
from tensordict import TensorDict
from torch import nn

from roll.core.fields import Batch
from roll.distributed.dynamic_batching import TokenBudget
from roll.distributed.micro_batches import forward_in_micro_batches, token_logprobs
from roll.distributed.row_images import row_images
from roll.distributed.sequence_packing import PackedSequences
from roll.distributed.strategies.offload import move_module_, release_cached_memory
from roll.distributed.workers.common import scoring_inputs, set_num_threads, take_memory_gib
from roll.distributed.workers.work_clock import Clocked, timed
from roll.models.loading import DType, load_policy


class ReferenceWorker(Clocked):
    """Log-probs of a frozen model (eval mode, no grad, no optimizer), computed once per distinct
    row of the batch (roll.distributed.micro_batches.forward_in_micro_batches)."""

    def __init__(
        self,
        model_path: str,
        *,
        micro_batch_size: int,
        num_threads: int | None = None,
        dtype: DType = "float32",
        attn_implementation: str | None = None,
        device: str = "cpu",
        budget: TokenBudget | None = None,
        sequence_packing: bool = False,
    ) -> None:
        set_num_threads(num_threads, device)
        self.device = torch.device(device)
        self.micro_batch_size = micro_batch_size
        self.budget = budget  # dynamic batching (`use_dynamic_batching_in_infer`); None: micro_batch_size rows
        self.sequence_packing = (
            sequence_packing  # each micro-batch as one packed row (roll.distributed.sequence_packing)
        )
        self.model = (
            load_policy(model_path, dtype=dtype, attn_implementation=attn_implementation, device=device, training=False)
            .to(self.device)  # type: ignore[arg-type]  # the stub of transformers' @wraps(Module.to) wants self
            .eval()
            .requires_grad_(False)
        )

    @timed("compute")
    def compute_logprobs(self, batch: TensorDict, temperature: float) -> torch.Tensor:
        """Log-probs (B, T) aligned as in roll.distributed.micro_batches.token_logprobs, CPU float32:
        of the response tokens where `batch` has a response mask, else of every real token."""

        def logprobs_forward(model: nn.Module, micro: TensorDict) -> dict[str, torch.Tensor]:
            logprobs, _ = token_logprobs(
                model,
                micro["input_ids"],
                micro["attention_mask"],
                temperature,
                images=row_images(micro),
                scored=micro.get(Batch.RESPONSE_MASK, None),
            )
            return {"logprobs": logprobs}

        batch = scoring_inputs(batch)
        # PackedSequences stands in for the module: called like it, every other attribute the model's
        model = cast(nn.Module, PackedSequences(self.model)) if self.sequence_packing else self.model
        return forward_in_micro_batches(
            model, batch, logprobs_forward, self.micro_batch_size, self.device, budget=self.budget
        )["logprobs"]

    def memory_gib(self) -> dict[str, float]:
        """This process's GPU memory since the last call (`take_memory_gib`); zeros on CPU."""
        return take_memory_gib()

    @timed("sync")
    def offload(self, to: str | torch.device = "cpu") -> None:
        """The frozen model to `to` (CPU by default) while a colocated role uses the device."""
        move_module_(self.model, to)
        release_cached_memory(self.device)

    @timed("sync")
    def reload(self) -> None:
        """The model back onto its device."""
        move_module_(self.model, self.device)
