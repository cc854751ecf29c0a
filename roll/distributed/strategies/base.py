"""The two engine interfaces, as the worker roles use them.

`TrainStrategy` is what the actor and critic roles (roll.distributed.workers.actor, .critic,
.common) call on a training engine: `torch`, `deepspeed`, `fsdp2`, `megatron`. `InferStrategy` is
what the inference worker (roll.distributed.workers.inference) calls on a generation engine: `hf`,
`vllm`, `sglang`. Each engine in `registry.TRAIN_STRATEGIES` / `INFER_STRATEGIES` provides every
member with a compatible signature; tests/distributed/test_strategy_protocols.py checks that on the
classes, with `inspect` (a method may add parameters only with defaults).

Constructors are not part of the interfaces: `registry.build_train_strategy` builds a training
engine from a model, and the inference worker builds `hf` from a model and the others from a model
dir. Engine-specific extras (megatron's `tp_rank`, `hf`'s continuous batching) stay outside.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict
    from torch import nn

    from roll.core.records import GenerateOutput, GenerateRequest
    from roll.distributed.micro_batches import MicroForward
    from roll.distributed.strategies.torch_train import LossFn


@runtime_checkable
class TrainStrategy(Protocol):
    """A training engine around one model: forwards, optimizer steps, weights and checkpoints."""

    model: nn.Module
    """The module the roles read weights from (`state_dict` is the engine's gathered view)."""
    param_counts: dict[str, int]
    """Total and trainable parameter counts, taken before an engine partitions the parameters."""
    dp_rank: int
    dp_size: int
    """This process's data-parallel rank and the number of them; a role splits minibatches by them."""
    balance_ranks: bool
    """Whether ranks' shares are balanced by tokens (sequence packing's plans), not split by rows."""
    dedupe_rows: bool
    """Whether forwards run once per distinct row (the actor reuses that for its own grouping)."""
    takes_old_logprobs: bool
    """Whether a training step may take PPO's old log-probs from its own forward
    (`roll.distributed.workers.old_logprobs`); the actor refuses a batch without them otherwise."""

    def forward_logprobs(
        self,
        batch: TensorDict,
        temperature: float,
        with_entropy: bool = False,
        micro_batch_size: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token log-probs (B, T) of `input_ids` under the model, and entropies if asked,
        aligned as in `roll.distributed.micro_batches.token_logprobs`: of the tokens under the
        batch's response mask where it has one, else of every real token; 0 elsewhere."""
        ...

    def forward(
        self, batch: TensorDict, forward: MicroForward, micro_batch_size: int | None = None
    ) -> dict[str, torch.Tensor]:
        """`forward(model, micro)` over micro-batches without gradients, outputs concatenated by row."""
        ...

    def train_step(
        self,
        minibatch: TensorDict,
        loss_fn: LossFn,
        weight_by: Literal["tokens", "rows"] = "tokens",
        total_weight: float | None = None,
    ) -> dict[str, float]:
        """One optimizer step over `minibatch` (this rank's share of `total_weight`); its metrics."""
        ...

    def sum_over_ranks(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` summed over the data-parallel ranks (a collective: every rank calls it), on
        this rank's device."""
        ...

    def step_lr_scheduler(self) -> None:
        """Advance the LR schedule by one pipeline step."""
        ...

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The full weights in HF names and shapes (gathered over ranks, LoRA merged)."""
        ...

    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Load HF-named full weights."""
        ...

    def save_checkpoint(self, directory: str | Path) -> None:
        """Weights, optimizer and schedule under `directory` (collective across ranks)."""
        ...

    def load_checkpoint(self, directory: str | Path) -> None:
        """Resume from `save_checkpoint`'s files."""
        ...

    def offload(self, to: str | torch.device = "cpu") -> None:
        """Move weights and optimizer state off the device (a colocated role takes it)."""
        ...

    def reload(self) -> None:
        """Bring back what `offload` moved."""
        ...


class CachedTokens(Protocol):
    """What the worker reads of an engine's `kv_cache`."""

    @property
    def num_tokens(self) -> int:
        """Tokens of session KV that roll keeps."""
        ...


@runtime_checkable
class InferStrategy(Protocol):
    """A generation engine: token ids in, token ids and log-probs out, weights swapped in place."""

    policy_version: int
    """The version of the weights it serves (set by `load_weights`)."""
    stats: dict[str, int]
    """The engine's own counters (prefix tokens reused, prefill tokens, ...)."""

    @property
    def kv_cache(self) -> CachedTokens:
        """Session KV that roll keeps; its `num_tokens` is reported (0 where the engine owns its cache)."""
        ...

    def generate_batch(self, requests: list[GenerateRequest]) -> list[GenerateOutput]:
        """One output per request, in request order."""
        ...

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """New actor weights (HF names), served from now on as `version`; stale session KV is dropped."""
        ...

    def offload(self) -> None:
        """Free the device for a colocated role."""
        ...

    def reload(self) -> None:
        """Bring the engine back after `offload`."""
        ...

    def release(self, session_id: str) -> bool:
        """Drop a finished conversation's cached KV; True if it was cached."""
        ...
