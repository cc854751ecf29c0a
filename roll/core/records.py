"""Typed records that cross process boundaries during rollout (the ground floor: engines, env
managers, agent loops, the pipeline and tracking all read them).

Everything an env manager sends to the inference worker, gets back, and finally hands to the
pipeline is one of these dataclasses. They hold plain Python lists so that Ray pickles them
cheaply and a reader can print one and understand it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from roll.core.enums import StopReason


@dataclass
class SamplingParams:
    """How to sample one response. `temperature == 0` or `do_sample=False` means greedy.
    `ignore_eos`: the engine's end-of-text ids do not stop it (vLLM's `ignore_eos`), only
    `stop_token_ids` and the length: a benchmark's way to fix response lengths."""

    max_new_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k truncation
    do_sample: bool = True
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        return (not self.do_sample) or self.temperature <= 0.0

    def stop_ids(self, eos_token_ids) -> frozenset[int]:
        """The ids that end a response: `stop_token_ids` and, unless `ignore_eos`, the EOS ids."""
        return frozenset(self.stop_token_ids) | (frozenset() if self.ignore_eos else frozenset(eos_token_ids))


@dataclass
class ImageInputs:
    """The images of one prompt as the model's own processor made them, in prompt order.

    `pixel_values` is the processor's (num_patches, patch_dim) float tensor for all images
    together; `image_grid_thw[k]` is image k's (t, h, w) patch grid, so image k owns
    t * h * w rows of `pixel_values` and t * h * w / merge_size**2 placeholder ids of the prompt.
    `frames` are the same images before the processor, (H, W, 3) uint8 arrays: what an engine that
    runs the model's processor itself takes (vLLM); None when the sender kept none (the VL env
    managers send them only to such an engine, and samples never carry them)."""

    pixel_values: Any  # torch.Tensor (num_patches, patch_dim)
    image_grid_thw: list[list[int]]
    frames: list[Any] | None = None  # numpy uint8 (H, W, 3), one per image

    @property
    def num_images(self) -> int:
        return len(self.image_grid_thw)


@dataclass
class GenerateRequest:
    """Token-in request to an inference worker.

    `seed` drives this request's sampling alone, so a response does not depend on which other
    requests happened to be batched with it (the same seed gives the same rollout).
    `session_id` names the conversation a multi-turn request belongs to; an engine may keep the
    KV of the ids it already processed for that session and prefill only what the prompt adds
    (the prompt is still sent whole, and a prompt that does not extend them is handled exactly).
    `images` (vision-language models) are the prompt's images; their placeholder ids are in
    `prompt_ids` already. `sample_offset` is the index of the first token to sample in the
    request's random stream: 0 for a new request; a request continued after an interruption
    (partial rollout) starts where its first part stopped, so it draws what it would have drawn.
    """

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    session_id: str | None = None
    images: ImageInputs | None = None
    sample_offset: int = 0


@dataclass
class GenerateOutput:
    """Token-out answer: the exact ids the engine sampled and their log-probs under the sampling
    distribution (after temperature). `finish_reason` is "stop" (a stop/eos token was produced,
    and it is the last id) or "length" (max_new_tokens reached).

    `token_versions[i]` is the policy version that sampled token i, and `logprobs[i]` is that
    version's log-prob. A request interrupted by a weight update and continued under the new
    weights (partial rollout) has older versions first; `policy_version` is the version that
    finished it (the newest). Left empty, every token is `policy_version`'s."""

    request_id: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    policy_version: int
    token_versions: list[int] = field(default_factory=list)

    def __post_init__(self):
        if not self.token_versions:
            self.token_versions = [self.policy_version] * len(self.token_ids)
        elif len(self.token_versions) != len(self.token_ids):
            raise ValueError(
                f"{self.request_id}: {len(self.token_ids)} ids but {len(self.token_versions)} token versions"
            )

    @property
    def oldest_version(self) -> int:
        """The oldest policy version among the tokens (`policy_version` when there are none)."""
        return min(self.token_versions, default=self.policy_version)


@dataclass
class StepRecord:
    """One env step as its own training sample (step-wise managers): the prompt it was given, the
    ids the engine generated with their log-probs, the step reward and the observed state's hash.
    `images` (vision-language managers) are the prompt's images, as sent with its request."""

    step: int
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    reward: float
    state_hash: str
    images: ImageInputs | None = None
    versions: list[int] = field(default_factory=list)  # per response id: the policy version that sampled it


@dataclass
class Trajectory:
    """One finished episode.

    Trajectory-wise managers (StarPO) fill `token_ids`: the whole conversation as one sequence —
    instruction and first observation, then for every turn the generated ids exactly as sampled
    followed by the tokenized next observation. `response_mask[i] == 1` iff token i was generated
    by the policy; `infer_logprobs[i]` is the engine's log-prob for generated tokens (0.0
    elsewhere); `turn_end_positions[k]` is the index of the last generated token of turn k, where
    `step_rewards[k]` is credited. Step-wise managers fill `steps` instead (one sample per step).

    `policy_versions[k]` is the oldest version of the weights that generated a token of turn k;
    `token_versions[i]` (trajectory-wise) the version that sampled token i (-1 where the policy did
    not generate it). In async training (weights updated while an episode runs) the turns of one
    episode may come from different versions, and with partial rollout the tokens of one turn too;
    `policy_version` is the newest of them.
    """

    tag: str
    traj_group_id: str
    traj_id: str
    env_seed: int
    step_rewards: list[float]
    success: bool
    stop_reason: StopReason  # a plain string of the same value is accepted (StrEnum)
    policy_version: int
    num_actions: int
    num_valid_actions: int
    token_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    infer_logprobs: list[float] = field(default_factory=list)
    turn_end_positions: list[int] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    # Kept only when asked for (validation with render_save_dir): the observation after reset and
    # after each action, and for each a caption ("reset (seed 3)", "'Left' -> reward 0").
    frames: list[str] = field(default_factory=list)
    frame_captions: list[str] = field(default_factory=list)
    policy_versions: list[int] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)
    rollout_s: float = 0.0  # seconds from the start of the group's episodes to this one's end
    # Vision-language managers: every image of `token_ids`, in order (None for text episodes)
    images: ImageInputs | None = None

    @property
    def oldest_policy_version(self) -> int | None:
        """The version of the oldest weights that generated a turn; None if no turn was generated
        (such an episode is no older than any policy)."""
        return min(self.policy_versions, default=None)

    def generated_token_versions(self) -> list[int]:
        """The policy version of every generated token, in order (both sample modes)."""
        if self.steps:
            return [v for s in self.steps for v in (s.versions or [self.policy_version] * len(s.response_ids))]
        if self.token_versions:
            return [v for v, m in zip(self.token_versions, self.response_mask) if m]
        return [self.policy_version] * sum(self.response_mask)

    @property
    def truncated(self) -> bool:
        """Cut rather than ended (`StopReason.is_truncation`): GAE bootstraps from its last state."""
        return StopReason(self.stop_reason).is_truncation

    @property
    def episode_reward(self) -> float:
        return float(sum(self.step_rewards))

    @property
    def num_generated_tokens(self) -> int:
        return sum(len(s.response_ids) for s in self.steps) if self.steps else sum(self.response_mask)

    @property
    def num_tokens(self) -> int:
        """Tokens the trainer sees for this episode (all step samples for step-wise)."""
        if self.steps:
            return sum(len(s.prompt_ids) + len(s.response_ids) for s in self.steps)
        return len(self.token_ids)


@dataclass
class GroupResult:
    """What an env worker returns for one group: the surviving trajectories and the failures."""

    group_index: int
    trajectories: list[Trajectory]
    dropped: list[str] = field(default_factory=list)  # one cause per dropped trajectory
    redundant: int = 0  # episodes stopped or left out because the group had enough (redundancy)
    # Ray calls the env worker made to inference workers, and the generate requests they carried,
    # since its previous result (any group's): the scheduler sums them per `collect`
    engine_calls: int = 0
    engine_requests: int = 0
