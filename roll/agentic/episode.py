"""One episode, as env managers and agent loops both play it: the settings of its env tag
(`EnvSpec`), which episode (`EpisodeSpec`) and its conversation as one token sequence
(`TokenLedger`).

Trajectory-wise env managers (`env_manager.traj_env_manager`) and agent loops (`agent_loop`) keep
the ids the engine produced and append the next observation or tool result after them, never
re-templating past turns; this ledger is the one place that bookkeeping lives.
"""

from __future__ import annotations

from dataclasses import dataclass

from roll.core.records import GenerateOutput


@dataclass(frozen=True)
class EnvSpec:
    """One env tag's settings as plain values (built from `custom_envs.<tag>` at the edge)."""

    tag: str
    env_type: str
    env_config: dict
    max_steps: int  # actions per trajectory
    max_tokens_per_step: int
    response_prefix: str = ""
    instruction: str | None = None  # None: the env's own; "": no system message
    # ROLL's per-tag keys (roll.configs.env.CustomEnvConfig documents each)
    agent_system_template: str | None = None
    agent_template: str | None = None
    history_length: int | None = None  # step-wise; None: the manager's
    use_thread_lock: bool = False
    max_env_step_concurrent: int = 0  # 0: no limit
    native_chat: bool = False  # step-wise: the env's info["messages"] is the prompt (native_env_manager)
    agent_runner_cls: str | None = None  # an agent runner plays the env through the chat proxy (proxy_env_manager)
    concat_history: bool = False  # step-wise: ROLL's StepConcatEnvManager {history} (templates.step_prompt_text)
    pre_step_template: str | None = None  # VL: the text before a turn's image; None: ROLL's default
    next_step_template: str | None = None  # VL: the text after a turn's image; None: ROLL's default
    vision: bool = False  # played by a VL env manager (image observations; vl_traj_/vl_step_env_manager)
    max_images_per_prompt: int | None = None  # VL: the engine's limit_mm_per_prompt.image; None: no limit
    send_frames: bool = False  # VL: requests carry the raw frames too (ImageInputs.frames), for vllm


@dataclass(frozen=True)
class EpisodeSpec:
    """Which episode to play: the env seed (shared by a group) and the sampling seed (per member).
    `tag` names the env or agent it belongs to when the player does not know it otherwise (an
    agent loop run on its own); env managers take it from their `EnvSpec`."""

    traj_group_id: str
    traj_id: str
    env_seed: int
    sample_seed: int
    keep_frames: bool = False
    tag: str = ""
    temperature: float | None = None  # this episode's sampling temperature (None: the manager's)


class TokenLedger:
    """The conversation as one token sequence, built by appending only: the prompt (mask 0),
    generated ids with their log-probs (mask 1), context ids between turns (observations, tool
    results; mask 0). `turn_ends[k]` is the index of turn k's last generated id, where its step
    reward `step_rewards[k]` is credited; `versions[k]` the oldest policy version among its tokens,
    and `token_versions[i]` the version that sampled id i (-1 on ids the policy did not generate)."""

    def __init__(self, prompt_ids: list[int]):
        self.token_ids = list(prompt_ids)
        self.response_mask = [0] * len(prompt_ids)
        self.logprobs = [0.0] * len(prompt_ids)
        self.token_versions = [-1] * len(prompt_ids)
        self.turn_ends: list[int] = []
        self.step_rewards: list[float] = []
        self.versions: list[int] = []

    def add_turn(self, out: GenerateOutput) -> None:
        """A generated turn; its step reward starts at 0 and the player adds to it."""
        if len(out.logprobs) != len(out.token_ids):
            raise ValueError(f"{out.request_id}: {len(out.token_ids)} ids but {len(out.logprobs)} logprobs")
        self._extend(out.token_ids, 1, out.logprobs, out.token_versions)
        self.turn_ends.append(len(self.token_ids) - 1)
        self.step_rewards.append(0.0)
        self.versions.append(out.oldest_version)

    def add_context(self, ids: list[int]) -> None:
        self._extend(ids, 0, [0.0] * len(ids), [-1] * len(ids))

    def _extend(self, ids: list[int], mask: int, logprobs: list[float], versions: list[int]) -> None:
        self.token_ids = self.token_ids + list(ids)  # a new list: a request may still hold the old
        self.response_mask += [mask] * len(ids)
        self.logprobs += [float(x) for x in logprobs]
        self.token_versions += list(versions)

    @property
    def num_turns(self) -> int:
        return len(self.turn_ends)

    def sample_fields(self) -> dict:
        """The `Trajectory` fields of a trajectory-wise sample."""
        return {
            "token_ids": self.token_ids,
            "response_mask": self.response_mask,
            "infer_logprobs": self.logprobs,
            "turn_end_positions": list(self.turn_ends),
            "token_versions": list(self.token_versions),
        }
