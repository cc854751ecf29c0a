"""The names of the training batch's fields, and the typed per-row info that travels beside it.

The batch is a `TensorDict` of (B, T) tensors aligned to token positions (the keys in `Batch`);
what is one value per row and not a tensor the engines need (ids, tags, step numbers, scores) is a
`RowInfo`. The pipeline writes both (`roll.pipeline.phases.batch`), the scoring phase and the workers
read them: by these names, so a reader finds every writer with one search.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import torch


class Batch:
    """Keys of the batch's tensors, all (B, T) and aligned to token positions."""

    INPUT_IDS: Final = "input_ids"
    ATTENTION_MASK: Final = "attention_mask"
    RESPONSE_MASK: Final = "response_mask"
    """1.0 exactly on the tokens the policy generated."""
    INFER_LOGPROBS: Final = "infer_logprobs"
    """The inference engine's log-probs of the generated tokens (0.0 elsewhere)."""
    TOKEN_LEVEL_REWARDS: Final = "token_level_rewards"
    """Trajectory-wise rows: each step reward on the last generated token of its turn."""
    OLD_LOGPROBS: Final = "old_logprobs"
    """The trained actor's log-probs of the response tokens before the update (0.0 elsewhere): from
    the score phase's pass, or taken in the actor's training call
    (`roll.distributed.workers.old_logprobs`)."""
    POLICY_VERSION: Final = "policy_version"
    """(int64) The policy version that sampled each generated token (-1 elsewhere): in async
    training a row may hold several (turns, or with partial rollout the parts of one turn)."""
    REF_LOGPROBS: Final = "ref_logprobs"
    """The reference model's log-probs of the response tokens (when the KL penalty is on; 0.0
    elsewhere)."""
    VALUES: Final = "values"
    """Critic values, values[:, t] = V(input_ids[:, :t]) (see `roll.distributed.workers.critic`)."""
    ADVANTAGES: Final = "advantages"
    RETURNS: Final = "returns"
    # Vision-language rows: not per token, so padding trims and pads leave them alone
    PIXEL_VALUES: Final = "pixel_values"
    """(B, P, D) each row's image patches as its processor made them, zero-padded to P patches."""
    IMAGE_GRID_THW: Final = "image_grid_thw"
    """(B, N, 3) each row's images' (t, h, w) patch grids in order; all-zero rows are padding."""
    IMAGE_HASH: Final = "image_hash"
    """(B, 2) int64 a 128-bit hash of each row's images: rows with equal images share a forward
    (`roll.distributed.row_images`)."""
    IMAGE_KEYS: Final = (PIXEL_VALUES, IMAGE_GRID_THW, IMAGE_HASH)


@dataclass
class RowInfo:
    """One entry per batch row: who it came from, and its scores. Step-wise rows (one per env step)
    also carry `step`, `state_hash`, `step_rewards` and `episode_scores`."""

    traj_group_id: list[str]
    traj_id: list[str]
    tag: list[str]
    truncated: torch.Tensor | None = None
    """(B,) bool: the row's trajectory was cut, not ended (`StopReason.is_truncation`)."""
    scores: torch.Tensor | None = None
    """Trajectory-wise (B,): the episode reward, raw (before any normalisation)."""
    step: list[int] | None = None
    state_hash: list[str] | None = None
    step_rewards: torch.Tensor | None = None
    """Step-wise (B,): the reward of the row's step."""
    episode_scores: torch.Tensor | None = None
    """Step-wise (B,): the trajectory's total reward, repeated on each of its steps."""
    final_values: torch.Tensor | None = None
    """(B,) critic value of the state after the row's last token (to bootstrap truncated rows)."""

    def group_keys(self, grouping: str) -> list:
        """Per row, the key of its group for `grouping` ("traj_group_id", "tag" or "batch")."""
        if grouping == "batch":
            return [0] * len(self.traj_id)
        return list(getattr(self, grouping))
