"""Config of environments (`custom_envs.<Tag>`) and of the env managers that run them.

Two meanings of "steps" meet here: `CustomEnvConfig.max_steps` counts actions in one trajectory,
while the top-level `max_steps` counts training steps.

Which env classes `env_type` names, and whether they take the `env_config` keys, is checked before
the run starts, outside the config models (`roll.pipeline.checks.config`): validation reads no files
and imports no env.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator, model_validator

from roll.configs.base import ConfigModel, InvalidField
from roll.configs.proxy import ProxyConfig
from roll.configs.roll_compat.unsupported import GEM_PREFIXES
from roll.configs.templates import check_agent_template
from roll.configs.worker import GeneratingArgs
from roll.core.enums import SampleMode

_IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")
"""`env_type` of a class given by import path: "package.module:ClassName"."""


class ToolConfig(ConfigModel):
    """One tool of ROLL's `tool_wrapper.tool_configs`."""

    tool_id: str
    """ROLL's tool id; only "python_code" (GEM's python tool, run in roll's sandbox)."""
    tool_args: dict[str, Any] = Field(default_factory=dict)
    """The tool's arguments (python_code: timeout, sandbox_type, keep_error_last_line)."""


class ToolWrapperConfig(ConfigModel):
    """ROLL's `custom_envs.<Tag>.tool_wrapper` around a GEM env."""

    wrapper_args: dict[str, Any] = Field(default_factory=dict)
    """GEM `ToolEnvWrapper` arguments: tool_reward, tool_success_reward, max_tool_uses."""
    tool_configs: list[ToolConfig] = Field(default_factory=list)
    """The tools; exactly one, python_code."""


class CustomEnvConfig(ConfigModel):
    """One environment kind, referred to by its tag (the key under `custom_envs`)."""

    env_type: str
    """A gymnasium id ("roll/FrozenLake-v0"), a short alias ("frozen_lake") or
    "package.module:ClassName" of a `roll.agentic.env.TextEnv` subclass; or "agent": the rows of
    `env_config.dataset` played by the agent loops they name (`roll.agentic.agent_loop.dataset`)."""
    env_config: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the env class's constructor, checked against its signature when the
    config is validated (plus `fault_injection`, which every env takes). For env_type "agent":
    `dataset` (a .jsonl/.parquet file) and optional default `agent_name` / `agent_cfg_path`."""
    max_steps: int = Field(10, ge=1)
    """Most actions in one trajectory; the episode is cut (stop reason "max_steps") after it.
    Not to be confused with the top-level `max_steps` (training steps)."""
    max_tokens_per_step: int = Field(64, ge=1)
    """Most tokens the model may generate for one action."""
    instruction: str | None = None
    """The task text shown as the system message; None uses the env's own
    (`info["env_instruction"]`), "" shows none (a tiny model trained from scratch gains nothing
    from a constant instruction, and step-wise samples repeat it in every prompt)."""
    response_prefix: str = ""
    """Text put after the assistant generation prompt as part of the prompt, and prepended to the
    model's text before the env parses it. RAGEN uses "<answer>" so that a model that does not
    know the answer format yet only has to produce the action."""

    env_manager_cls: str | None = None
    """ROLL's env manager class path of this tag: ROLL's or our `TrajEnvManager` ("traj"),
    `StepEnvManager` ("step") or ROLL's `AgentNativeStepEnvManager` / our `NativeStepEnvManager`
    ("native": step-wise samples whose prompt is the env's own chat, `info["messages"]`;
    roll.agentic.env_manager.native_env_manager). The managers running the tag take that type
    (`roll.configs.roll_compat.dialect.ENV_MANAGER_CLASSES`); any other path is refused. Image observations
    (docs/vision_language.md): ROLL's or our `VLTrajEnvManager` (trajectory- or step-wise, as the
    manager's `env_manager_type` says) or our `VLStepEnvManager` ("step")."""
    agent_runner_cls: str | None = None
    """ROLL's key: the agent runner that plays this tag through the chat proxy (with
    `env_manager_cls` ROLL's or our `ProxyEnvManager`; roll.agentic.proxy). ROLL's `GEMRunner` /
    `ToolCallRunner` paths map to ours (roll.agentic.proxy.runners); a user's runner is named
    `package.module.Class` or `package.module:Class`. null: the env manager plays the env itself."""
    tool_wrapper: ToolWrapperConfig | None = None
    """ROLL's key, for GEM env ids only: wrap the env in GEM's `ToolEnvWrapper` with one
    `python_code` tool whose code runs in roll's sandbox (envs/gem_envs/tools.py, docs/gem_envs.md)."""
    use_thread_lock: bool = False
    """ROLL's key: this tag's env.reset/env.step calls take one lock shared by the env worker
    process, one call at a time (for envs whose steps are heavy CPU work or not thread-safe)."""
    history_length: int | None = Field(None, ge=0)
    """Step-wise: earlier turns shown in a step's prompt (ROLL's per-tag key); None uses the env
    manager's `history_length`."""
    max_env_step_concurrent: int = Field(0, ge=0)
    """ROLL's key: most env.step calls of this tag running at once in one env worker process
    (0: no limit). ROLL counts across all env workers; here each env worker counts its own."""
    agent_system_template: str | None = None
    """ROLL's key: the system message of every prompt; None: the `instruction` rule above."""
    agent_template: str | None = None
    """ROLL's key: the user message of each turn, a `str.format` template filled as ROLL fills it.
    Trajectory-wise: `{observation}`, `{turn_idx}` (1-based), `{actions_left}`,
    `{max_response_length}` (= max_tokens_per_step); the first turn is prefixed with the env's
    instruction and a newline. Step-wise: `{env_instruction}`, `{history}` (the last
    `history_length` steps as "(step: N, observation: ..., action: ..., reward: ...)"),
    `{step_count}`, `{history_length}`, `{current_step}`, `{current_observation}`,
    `{max_response_length}`. None: the observation alone is the user message."""
    pre_step_template: str | None = None
    """ROLL's key (its `VLTrajEnvManager`): the text before each turn's image, with `{turn_idx}`
    (1-based); the first turn's is prefixed with the env's instruction. None: ROLL's default
    ("\nTurn {turn_idx}:\nState:\n"). Only for a tag played by the VL env manager."""
    next_step_template: str | None = None
    """ROLL's key (its `VLTrajEnvManager`): the text after each turn's image, with
    `{actions_left}` and `{max_response_length}` (= max_tokens_per_step). None: ROLL's default.
    Only for a tag played by the VL env manager."""

    @field_validator("agent_template")
    @classmethod
    def _known_placeholders(cls, template: str | None) -> str | None:
        if template is not None:
            check_agent_template(template)
        return template

    @field_validator("env_type")
    @classmethod
    def _import_path_form(cls, env_type: str) -> str:
        # Checked here because importlib's own errors for a malformed path (".x:C", "a..b:C") say
        # nothing about env_type, and some of them are TypeErrors.
        if ":" in env_type and not env_type.startswith(GEM_PREFIXES) and not _IMPORT_PATH.fullmatch(env_type):
            raise ValueError(
                f"{env_type!r} is not of the form 'package.module:ClassName' "
                "(or give a registered id or alias, without ':')"
            )
        return env_type


class EnvManagerConfig(ConfigModel):
    """A pool of env groups that produces trajectories (for training or validation).

    The `group_size` envs of one group share one seed, hence one start state, so that GRPO/GiGPO
    can compare their outcomes. `num_env_groups` is how many groups run concurrently; a training
    step consumes `rollout_batch_size / group_size` complete groups, so fewer concurrent groups
    just means that groups are run again until the step has enough.
    """

    num_env_groups: int = Field(ge=1)
    """Env groups running concurrently."""
    group_size: int = Field(1, ge=1)
    """Envs (trajectories) per group, all started from the same seed."""
    group_size_redundancy: int = Field(0, ge=0)
    """Extra envs per group (ROLL's name): a group plays `group_size + group_size_redundancy`
    episodes on its seed and is complete as soon as `group_size` of them have finished; the rest
    are stopped and their envs made anew. A slow, hung or crashed env then costs neither the group
    nor the wait for it. Which members are kept depends on timing (the fastest), so with a value
    above 0 runs are not bitwise reproducible, and quick episodes are slightly favoured."""
    rescue_rounds: int = Field(0, ge=0)
    """Training only: a group none of whose episodes succeeded is played again on its env seed,
    `group_size` more episodes with sampling seeds of their own, up to this many rounds until one
    succeeds; every round's episodes join the group. A group that always fails gives a
    group-relative advantage nothing; one success among the extra episodes gives the whole group
    a signal. Metrics `rollout/rescue_rounds` and `rollout/rescued_groups` (groups that a rescue
    round gave their first success). 0: off. The page: docs/algorithms.md."""
    rescue_temperature: float | None = Field(None, gt=0)
    """The sampling temperature of rescue rounds; None: the rollout's own. A hotter round tries
    the moves the policy finds unlikely. Its tokens come from another distribution than the
    trainer's, and the log-probs recorded for them are that distribution's, so
    `off_policy_correction` or `train_infer_correction` is what weighs them. Needs
    `rescue_rounds` > 0; refused for tags played by agent runners or agent loops (they sample on
    their own)."""
    tags: list[str] = Field(min_length=1)
    """Which `custom_envs` this manager runs."""
    num_groups_partition: list[int] | None = None
    """Groups per tag, in the order of `tags`, summing to `num_env_groups`. Left out, the groups
    are divided equally (ROLL's default): each tag gets `num_env_groups // len(tags)`, and the
    remainder goes one each to the first tags (7 groups, 3 tags: [3, 2, 2])."""
    format_penalty: float | None = None
    """ROLL's key: the `format_penalty` of this manager's envs whose `env_config` sets none (and
    whose class takes one). ROLL itself reads only `env_config.format_penalty`; it is the same
    whenever env_config sets it. None: the env's own default."""
    max_env_num_per_worker: int = Field(0, ge=0)
    """Most envs in one env-worker process; 0 puts all envs in one env worker."""
    env_manager_type: SampleMode = SampleMode.TRAJ
    """"traj" (StarPO): one training sample per trajectory, the whole multi-turn conversation;
    "step" (GiGPO): one sample per env step, its prompt the instruction, the last
    `history_length` turns and the current observation. Validate with the type you train with."""
    history_length: int = Field(0, ge=0)
    """Step-wise only: how many earlier (observation, answer) turns a step's prompt shows (a VL
    tag: frames and answers, so a prompt holds up to `history_length` + 1 images)."""
    env_step_timeout_s: float = Field(60.0, gt=0)
    """Most seconds one `env.reset` or `env.step` may take; a call over it drops its trajectory
    (cause "env.step exceeded ..."), and the env is closed and made anew for the next episode."""
    generate_timeout_s: float = Field(300.0, gt=0)
    """Most seconds one generate request may wait for its answer (queueing in the inference
    worker included); over it the trajectory is dropped (cause "generate timeout ...") and its env
    made anew. A group that lost every trajectory is replaced by a fresh group."""
    system_envs: dict[str, str] = Field(default_factory=dict)
    """ROLL's key (its env manager is a worker config): environment variables set in this manager's
    env-worker processes, on top of the top-level `system_envs`."""
    proxy: ProxyConfig = Field(default_factory=ProxyConfig)
    """The chat proxy of tags played by agent runners (`roll.configs.proxy`)."""
    generating_args: GeneratingArgs | None = None
    """Sampling of this manager's requests: the keys given here replace those of
    `actor_infer.generating_args`, the others are inherited (e.g. `{do_sample: false}` for
    greedy validation). None uses the actor's as they are."""

    @model_validator(mode="after")
    def _check_tags_and_partition(self) -> EnvManagerConfig:
        if self.rescue_temperature is not None and not self.rescue_rounds:
            raise InvalidField("rescue_temperature", "needs rescue_rounds > 0 (it is the rescue rounds' temperature)")
        if len(set(self.tags)) != len(self.tags):
            raise InvalidField("tags", f"must be distinct (got {self.tags})")
        partition = self.num_groups_partition
        if partition is None:
            if self.num_env_groups < len(self.tags):
                raise InvalidField(
                    "num_env_groups",
                    f"{self.num_env_groups} cannot be divided among "
                    f"{len(self.tags)} tags {self.tags} (each needs a group)",
                )
            return self
        if len(partition) != len(self.tags):
            raise InvalidField(
                "num_groups_partition",
                f"needs one number per tag {self.tags}, got {partition}",
            )
        if any(n < 0 for n in partition) or sum(partition) != self.num_env_groups:
            raise InvalidField(
                "num_groups_partition",
                f"{partition} must be non-negative and sum to num_env_groups={self.num_env_groups}",
            )
        return self

    @property
    def groups_per_tag(self) -> dict[str, int]:
        """How many env groups run each tag (the resolved `num_groups_partition`)."""
        partition = self.num_groups_partition or equal_partition(self.num_env_groups, len(self.tags))
        return dict(zip(self.tags, partition, strict=True))

    @property
    def slot_tags(self) -> list[str]:
        """The tag of each env-group slot, each tag's slots spread evenly over the list (group j
        of a step plays slot j's tag): the first groups of a step already play every tag in
        proportion, whether a step takes all `num_env_groups` or fewer. Ties go to the earlier tag."""
        counts = self.groups_per_tag
        total = sum(counts.values())
        placed = dict.fromkeys(counts, 0)
        tags = []
        for i in range(1, total + 1):
            tag = max(counts, key=lambda t: (counts[t] * i / total - placed[t], -self.tags.index(t)))
            placed[tag] += 1
            tags.append(tag)
        return tags

    @property
    def num_envs(self) -> int:
        """Envs this manager runs concurrently."""
        return self.num_env_groups * (self.group_size + self.group_size_redundancy)


def equal_partition(num_groups: int, num_tags: int) -> list[int]:
    """`num_groups` divided among `num_tags` as equally as possible, the remainder one each to
    the first tags: (7, 3) -> [3, 2, 2]."""
    share, rest = divmod(num_groups, num_tags)
    return [share + (i < rest) for i in range(num_tags)]
