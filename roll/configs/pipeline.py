"""The top-level config of an agentic RL run: the whole YAML, validated.

Checks that involve several sections live in one model validator here, each error naming the
exact key; values derived from several fields (groups per step, whether KL is on, ...) are
properties here, so no other module recomputes them.
"""

from __future__ import annotations

import os
from typing import Literal, cast

from pydantic import Field, field_validator, model_validator

from roll.configs.args import check_model_dir
from roll.configs.base import InvalidField
from roll.configs.correction import OffPolicyCorrection
from roll.configs.env import CustomEnvConfig, EnvManagerConfig
from roll.configs.reward_norm import RewardNormalization
from roll.configs.roll_compat.dialect import RollDialect, check_dialect
from roll.configs.worker import (
    GeneratingArgs,
    WorkerConfig,
    check_strategy_for_role,
    check_token_budgets,
)
from roll.core.enums import SampleMode

GROUP_RELATIVE = ("grpo", "gigpo")
"""Estimators whose advantages compare the members of a group with each other."""


class PipelineConfig(RollDialect):
    """Everything `AgenticPipeline` needs. Field names follow ROLL's agentic YAMLs."""

    exp_name: str = Field("roll", min_length=1)
    """Name of the experiment (ROLL's key). roll reads nothing from it; the example YAMLs use it
    in paths, `output_dir: ./output/${exp_name}`."""
    seed: int = Field(42, ge=0)
    """Root of every random choice in the run (env seeds, sampling, init), via `derive_seed`;
    non-negative, as numpy's and the envs' seeds are."""
    logging_dir: str = "./output/logs"
    """TensorBoard event files go here."""
    output_dir: str = "./output"
    """`metrics.jsonl` and `checkpoints/step_N/` go here."""
    render_save_dir: str | None = None
    """Text frames of validation episodes go here; None saves none."""
    trace_rollouts: bool = False
    """Write every trajectory of a step (decoded text per turn, tool calls, token counts, rewards,
    timing, policy versions) to `output_dir/traces/step_N.jsonl` (`val_step_N.jsonl` for
    validations); see `roll.tracking.traces`."""
    trace_samples_to_tensorboard: int = Field(0, ge=0)
    """With `trace_rollouts`: also show this many trajectories of each step as TensorBoard text."""
    trace_to_mlflow: bool = False
    """With `trace_rollouts`: also log each step's trace file as an mlflow artifact (when mlflow
    is installed; `MLFLOW_TRACKING_URI` says where). Without mlflow a warning, nothing else."""
    max_steps: int = Field(ge=1)
    """Training steps (rollout + update) of the run. Not `custom_envs.<Tag>.max_steps`, which
    counts actions in one trajectory."""
    save_steps: int = Field(0, ge=0)
    """Save a checkpoint every `save_steps` training steps and at the last step; 0 never saves."""
    logging_steps: int = Field(1, ge=1)
    """Log metrics every `logging_steps` training steps."""
    eval_steps: int = Field(0, ge=0)
    """Validate every `eval_steps` training steps; 0 turns validation off."""
    resume_from_checkpoint: bool | str = False
    """False starts fresh; True resumes from the latest complete checkpoint under `output_dir`
    (fresh if there is none yet); a path resumes from that checkpoint directory (it must exist)."""
    overwrite_output_dir: bool = False
    """A fresh run (`resume_from_checkpoint: false`) refuses to start in an `output_dir` that holds
    another run's `metrics.jsonl` or checkpoints; true lets it, deleting those first so that the
    two runs' metrics and checkpoints never mix (`roll.pipeline.checks.resources`)."""
    pretrain: str
    """Local HF model dir (with config.json) that every role loads unless its
    `model_args.model_name_or_path` says otherwise."""
    reward_pretrain: str | None = None
    """Local HF model dir of the critic; None uses `pretrain`."""
    adv_estimator: Literal["gae", "grpo", "reinforce", "gigpo", "step_reinforce"] = "grpo"
    """"gae": critic-based GAE (needs `critic`); "grpo": reward minus the group mean (divided by
    the group std if `norm_adv_by_std_in_grpo`; for step-wise samples the mean and std are over
    the group's trajectories); "reinforce": the discounted return. Step-wise only: "gigpo"
    (episode + anchor-state step advantages), "step_reinforce" (normalised step returns)."""
    step_reward_gamma: float = Field(0.95, ge=0, le=1)
    """Step-wise estimators: discount of step rewards across env steps."""
    episode_reward_weight: float = 1.0
    """GiGPO: weight of the episode-level (group) advantage."""
    step_reward_weight: float = 1.0
    """GiGPO: weight of the step-level (anchor state) advantage."""
    ppo_epochs: int = Field(1, ge=1)
    """Passes over each rollout batch, in mini-batches of `training_args.mini_batch_size`."""
    gamma: float = Field(1.0, ge=0, le=1)
    """Discount factor across tokens/steps."""
    lambd: float = Field(0.95, ge=0, le=1)
    """GAE lambda."""
    pg_clip: float = Field(0.2, gt=0)
    """PPO clip range of the probability ratio: [1 - pg_clip, 1 + pg_clip]."""
    rollout_filter_ratio: float = Field(1.0, gt=0, le=1)
    """StarPO-S uncertainty filtering: train only on this fraction of each step's groups, those
    whose members' episode rewards differ most (std); 1.0 keeps every group. A group whose members
    all scored the same gives GRPO/GiGPO no signal, only noise."""
    max_consecutive_skipped_steps: int = Field(3, ge=0)
    """An optimizer step with a non-finite loss or gradient is skipped and counted
    (`actor/skipped_steps`); this many in a row stop the run with a clear error (0: never stop)."""
    reward_normalization: RewardNormalization | None = None
    """Normalise episode scores before the estimator (null: off). Trajectory-wise rows then carry
    the normalised score as their only reward, on the last generated token (as in ROLL); step-wise
    rows use it as the episode score of "grpo"/"gigpo"; "step_reinforce" normalises each row's
    discounted step return with it instead (over the rows of each group, as ROLL). GRPO already
    centres (and scales) within traj groups, so the useful combinations are other groupings, e.g.
    batch whitening for GAE."""
    reward_clip: float | None = Field(None, gt=0)
    """Clamp the rewards the estimator sees to [-reward_clip, reward_clip], after normalisation (as
    ROLL): trajectory-wise rows' token rewards (with normalisation, the one normalised score),
    step-wise rows' episode scores and step rewards. null: no clamp. Metric
    `critic/reward_clip_frac`: the fraction of rows with a clamped reward."""
    advantage_clip: float | None = Field(None, gt=0)
    """Clamp advantages to [-advantage_clip, advantage_clip], after whitening (as ROLL). null: no
    clamp. Metric `critic/advantage_clip_frac`: the fraction of generated tokens clamped."""
    pg_clip_low: float | None = Field(None, gt=0)
    """Lower clip range, [1 - pg_clip_low, ...]; None uses `pg_clip`."""
    pg_clip_high: float | None = Field(None, gt=0)
    """Upper clip range, [..., 1 + pg_clip_high]; None uses `pg_clip`. A larger upper range than
    lower ("clip-higher", DAPO / StarPO-S) lets unlikely good tokens grow faster."""
    value_clip: float | None = Field(0.5, gt=0)
    """Critic values are clipped to old value +- value_clip in the value loss; None: no clipping."""
    init_kl_coef: float = Field(0.0, ge=0)
    """Weight of the KL penalty against `reference` (initial value when `target_kl` is set)."""
    target_kl: float | None = Field(None, gt=0)
    """When set, the KL weight adapts towards this per-token KL (adaptive controller); None keeps
    it fixed at `init_kl_coef`."""
    kl_horizon: int = Field(10000, ge=1)
    """Horizon of the adaptive KL controller, in samples."""
    kl_penalty: Literal["kl", "abs", "mse", "k3", "low_var_kl"] = "kl"
    """Estimator of the reward-side KL penalty (`init_kl_coef`): "kl" (k1) log pi - log pi_ref,
    "abs" |k1|, "mse" (k2) k1^2 / 2, "k3" exp(-k1) + k1 - 1, "low_var_kl" k3 clamped to [-10, 10]
    (see `roll.algorithms.kl`). ROLL's "full" (the exact KL over the vocabulary) is not supported."""
    use_kl_loss: bool = False
    """Add kl_loss_coef * KL(pi || reference) to the actor's loss (GRPO-style, the gradient flows
    through log pi); runs the `reference` role. Independent of the reward-side `init_kl_coef`, and
    available for step-wise samples too."""
    kl_loss_coef: float = Field(0.0, ge=0)
    """Weight of the KL loss term when `use_kl_loss` is on (ROLL's default 0)."""
    kl_loss_type: Literal["kl", "abs", "mse", "k3", "low_var_kl"] = "low_var_kl"
    """Estimator of the KL loss term, as `kl_penalty` (verl's key). ROLL has no key for it and always
    uses k3 clamped to [-10, 10], which is the default "low_var_kl"."""
    whiten_advantages: bool = False
    """Normalise advantages over the whole batch to zero mean and unit std."""
    norm_adv_by_std_in_grpo: bool = True
    """GRPO divides by the group std; False keeps only the mean subtraction (Dr. GRPO)."""
    virtual_max_score: float | None = None
    """Step-wise "grpo" / "gigpo": each group's episode mean and std also count one virtual
    trajectory with this score, the task's best (NGRPO's advantage calibration), so a group that
    all failed alike gets negative advantages instead of none; null (the default): no virtual one."""
    entropy_loss_coef: float = Field(0.0, ge=0)
    """Weight of the entropy bonus in the actor loss (loss -= coef * entropy)."""
    entropy_loss_coef_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """The bonus's weight over the run: `entropy_loss_coef` at every step, or decayed from it at
    step 1 to 0 at `max_steps`, linearly or as the cosine learning-rate schedule decays
    (`roll.algorithms.schedules`): exploration early, none of the bonus's pull toward a flat policy
    late. Logged as `actor/entropy_loss_coef`."""
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"] = "token-mean"
    """How per-token losses become one number: mean over all tokens of the batch, or per sequence
    first (mean or sum over its tokens) and then the mean over sequences."""
    async_generation_ratio: int = Field(0, ge=0)
    """k: how many steps rollout runs ahead of training. 0 is synchronous: step t's rollout starts
    after step t-1's weights are in the engine, and a run is reproducible from its seed. With k > 0,
    as soon as step t's groups are collected, the groups of steps t+1..t+k start on the current
    weights and keep generating while step t scores and trains. What a weight sync does to the
    requests in the engine at that moment is `partial_rollout`; later turns of the same episode use
    the new weights (the engine drops every conversation's cached KV on the update, so no turn
    reuses keys and values of old weights). An episode may thus mix versions: each token records
    the version that sampled it; the batch reports `rollout/staleness_mean`,
    `rollout/staleness_max`, `rollout/mixed_version_trajectories` and
    `rollout/tokens_by_version_lag/<lag>`; at collect time a group whose oldest token is more than
    k versions old is dropped and played again (`rollout/stale_dropped_groups`). Groups queued
    behind busy env slots start at the next collect (results are only received there), so give
    enough `num_env_groups`. Which weights a turn sees depends on timing, so k > 0 is not bitwise
    reproducible; a resumed run regenerates the groups that were in flight. Pair it with
    `off_policy_correction`."""
    async_max_staleness: int | None = Field(None, ge=0)
    """The oldest token a trained trajectory may hold, in versions behind the weights being
    trained: a group with an older one is dropped at collect and played again. null: k
    (`async_generation_ratio`; a group run k steps ahead is at most k versions old, unless
    partial rollout carries it over). Rollout runs ahead at most this many steps, since a group
    started a steps early is at least a versions old when trained: 0 runs nothing ahead, and the
    run trains exactly what a synchronous run trains (a check of the async path: the same seed
    gives a synchronous run's losses). Needs k > 0."""
    partial_rollout: Literal["finish", "continue", "abort"] = "finish"
    """What a weight sync does to the generations running in the engine (async training; in a
    synchronous run nothing runs at a sync). false ("finish"): they end on the old weights first,
    so the sync waits for the slowest of them. true ("continue"): the engine stops them at a token boundary, takes the
    new weights and continues each from where it stopped, its prefix's KV recomputed under the
    new weights; no token is thrown away, and each keeps the version and log-prob it was sampled
    with (the batch's `policy_version`, so the importance ratios and `train_infer_correction`
    are per token against the version that sampled it). "abort" (ROLL's behaviour, for
    comparison): their tokens are thrown away and the turn is generated again on the new
    weights. Counted per step in `rollout/interrupted_requests` and `rollout/discarded_tokens`.
    Needs a continuous engine: `hf` or `vllm` (text models)."""
    off_policy_correction: OffPolicyCorrection | None = None
    """Truncated importance weights between the engine's and the trainer's log-probs (null: off)."""
    rollout_batch_size: int = Field(ge=1)
    """Trajectories per training step; a multiple of `train_env_manager.group_size`."""
    val_batch_size: int = Field(0, ge=0)
    """Trajectories per validation; a multiple of `val_env_manager.group_size`."""
    sequence_length: int = Field(2048, ge=1)
    """Most tokens of one trajectory (prompt, responses and observations together)."""
    ray_address: str | None = None
    """Address of a running Ray cluster; None starts a local Ray."""
    actor_train: WorkerConfig | None = None
    """The policy being trained. Left out (with `actor_infer` given): a rollout-only run, ROLL's
    AgenticRolloutPipeline (`roll.configs.rollout`, `roll.pipeline.rollout_pipeline`)."""
    actor_infer: WorkerConfig
    """The policy's inference engine, which serves the env managers."""
    critic: WorkerConfig | None = None
    """Value model; required by adv_estimator "gae"."""
    reference: WorkerConfig | None = None
    """Frozen policy for the KL penalty and the KL loss; required when `init_kl_coef > 0`,
    `target_kl` is set or `use_kl_loss` is on."""
    train_env_manager: EnvManagerConfig
    """Envs that produce training trajectories."""
    val_env_manager: EnvManagerConfig | None = None
    """Envs that produce validation trajectories; required when `eval_steps > 0`."""
    custom_envs: dict[str, CustomEnvConfig]
    """Environment kinds by tag, referred to by the env managers' `tags`."""

    @field_validator("pretrain", "reward_pretrain")
    @classmethod
    def _is_model_dir(cls, path: str | None) -> str | None:
        return path if path is None else check_model_dir(path)

    @field_validator("partial_rollout", mode="before")
    @classmethod
    def _mode_of_bool(cls, value: object) -> object:
        """true / false are "continue" / "finish"."""
        return {True: "continue", False: "finish"}.get(value, value) if isinstance(value, bool) else value

    @field_validator("resume_from_checkpoint", mode="plain", json_schema_input_type=bool | str)
    @classmethod
    def _bool_or_existing_dir(cls, value: object) -> bool | str:
        # "plain": a bool|str union would report one error per member for a single bad value.
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and os.path.isdir(value):
            return value
        raise ValueError(f"expected true, false or an existing checkpoint directory (got {value!r})")

    @model_validator(mode="after")
    def _check_and_fill(self) -> PipelineConfig:
        check_dialect(self)  # ROLL's class paths and run-level keys (roll.configs.roll_compat.dialect)
        self._check_partial_rollout()
        if self.async_max_staleness is not None and self.async_generation_ratio == 0:
            raise InvalidField("async_max_staleness", "limits async training; set async_generation_ratio > 0 too")
        for role, worker in self.workers.items():
            check_strategy_for_role(role, worker)
        self._check_batches()
        if not self.rollout_only:  # a rollout-only run reads no estimator, KL or validation key
            self._check_required_roles()
        for name, manager in self.env_managers.items():
            for tag in manager.tags:
                if tag not in self.custom_envs:
                    raise InvalidField(f"{name}.tags", f"{tag!r} is not in custom_envs {sorted(self.custom_envs)}")
        self._check_agent_tags()
        self._fill_model_paths()
        for role, worker in self.workers.items():  # needs the model paths: after filling them
            check_token_budgets(role, worker, self.sequence_length)
        return self

    @property
    def staleness_limit(self) -> int:
        """The versions a trained token may lag (`async_max_staleness`, else k)."""
        return self.async_generation_ratio if self.async_max_staleness is None else self.async_max_staleness

    @property
    def steps_ahead(self) -> int:
        """The steps whose groups start before their step's rollout: k, but no more than the
        staleness limit (a group started a steps early is at least a versions old when trained)."""
        return min(self.async_generation_ratio, self.staleness_limit)

    def _check_partial_rollout(self) -> None:
        """Only the continuous engines (`hf`, `vllm`) stop a generation at a token boundary."""
        if self.partial_rollout == "finish":
            return
        if self.async_generation_ratio == 0:
            raise InvalidField(
                "partial_rollout",
                f"{self.partial_rollout!r} acts on generations running at a weight sync, and with "
                "async_generation_ratio 0 none is; set async_generation_ratio > 0 or leave it false",
            )
        engine = self.actor_infer.strategy_args
        if engine.strategy_name not in ("hf", "vllm"):
            raise InvalidField(
                "partial_rollout",
                f"{self.partial_rollout!r} needs actor_infer on a continuous engine (hf or vllm); "
                f"{engine.strategy_name!r} finishes each engine call before a weight sync (use false)",
            )
        if not engine.strategy_config.get("continuous_batching", True):
            raise InvalidField(
                "partial_rollout",
                f"{self.partial_rollout!r} needs actor_infer.strategy_args.strategy_config.continuous_batching: true",
            )

    def _check_agent_tags(self) -> None:
        """Agent loops give one sample per trajectory: their tags need a "traj" manager. Agent
        loops and agent runners sample on their own: their tags take no `rescue_temperature`."""
        for name, manager in self.env_managers.items():
            agent_tags = [t for t in manager.tags if self.custom_envs[t].env_type == "agent"]
            if agent_tags and manager.env_manager_type != SampleMode.TRAJ:
                raise InvalidField(
                    f"{name}.env_manager_type",
                    f'tags {agent_tags} have env_type "agent", '
                    'which needs "traj" (agent loops give one sample per trajectory)',
                )
            runners = [
                t
                for t in manager.tags
                if self.custom_envs[t].env_type == "agent" or self.custom_envs[t].agent_runner_cls
            ]
            if runners and manager.rescue_temperature is not None:
                raise InvalidField(
                    f"{name}.rescue_temperature",
                    f"tags {runners} are played by agent loops or agent runners, which sample on their own",
                )

    def _check_batches(self) -> None:
        group_size = self.train_env_manager.group_size
        if self.rollout_batch_size % group_size:
            raise InvalidField(
                "rollout_batch_size",
                f"{self.rollout_batch_size} is not a multiple of train_env_manager.group_size={group_size}",
            )
        if self.rollout_only:
            return
        if self.eval_steps > 0 and self.val_env_manager is None:
            raise InvalidField("val_env_manager", "required when eval_steps > 0")
        if self.eval_steps > 0 and self.val_batch_size == 0:
            raise InvalidField("val_batch_size", "must be > 0 when eval_steps > 0")
        if self.val_env_manager is not None:
            if self.val_env_manager.rescue_rounds:
                raise InvalidField(
                    "val_env_manager.rescue_rounds",
                    "validation plays a fixed set of episodes; rescue rounds are for train_env_manager",
                )
            group_size = self.val_env_manager.group_size
            if self.val_batch_size % group_size:
                raise InvalidField(
                    "val_batch_size",
                    f"{self.val_batch_size} is not a multiple of val_env_manager.group_size={group_size}",
                )

    def _check_required_roles(self) -> None:
        step_wise = self.sample_mode == SampleMode.STEP
        if step_wise and self.adv_estimator in ("gae", "reinforce"):
            raise InvalidField(
                "adv_estimator",
                f'"{self.adv_estimator}" needs env_manager_type "traj"; '
                'step-wise samples take "grpo", "gigpo" or "step_reinforce"',
            )
        if step_wise and self.uses_kl_penalty:
            key, off = ("init_kl_coef", "use 0") if self.init_kl_coef > 0 else ("target_kl", "use null")
            raise InvalidField(key, f"the KL penalty is not available for step-wise samples yet; {off}")
        if not step_wise and self.adv_estimator in ("gigpo", "step_reinforce"):
            raise InvalidField(
                "adv_estimator", f'"{self.adv_estimator}" needs train_env_manager.env_manager_type "step"'
            )
        if self.virtual_max_score is not None and not (step_wise and self.adv_estimator in GROUP_RELATIVE):
            raise InvalidField(
                "virtual_max_score", 'applies to step-wise "grpo" and "gigpo" only (env_manager_type "step")'
            )
        if self.adv_estimator == "gae" and self.critic is None:
            raise InvalidField("critic", 'required by adv_estimator "gae"')
        if self.uses_kl and self.reference is None:
            raise InvalidField("reference", "required when init_kl_coef > 0, target_kl is set or use_kl_loss is on")
        self._check_training_samples()

    def _check_training_samples(self) -> None:
        """A group-relative estimator compares the members of a group, which start from one state:
        played greedily they play the same moves, every advantage is 0 and nothing is learnt.
        Greedy validation is fine. The key named is the one that made the sampling greedy."""
        if self.adv_estimator not in GROUP_RELATIVE:
            return
        gen = self.generating_args_for(self.train_env_manager)
        key = "do_sample" if not gen.do_sample else "temperature" if gen.temperature == 0 else None
        if key is None:
            return
        override = self.train_env_manager.generating_args
        where = "train_env_manager" if override is not None and key in override.model_fields_set else "actor_infer"
        raise InvalidField(
            f"{where}.generating_args.{key}",
            f"{str(getattr(gen, key)).lower()} makes the training rollouts greedy: the members of each "
            f"{self.adv_estimator} group would play alike and their advantages would all be 0 (nothing learnt); "
            "sample for training (do_sample: true, temperature > 0) and make only val_env_manager greedy",
        )

    def _fill_model_paths(self) -> None:
        """Give every role without an explicit model the run's one (the critic's: reward_pretrain,
        else pretrain). The one place where `model_name_or_path` gets its default."""
        for role, worker in self.workers.items():
            if worker.model_args.model_name_or_path is None:
                default = self.reward_pretrain if role == "critic" else None
                worker.model_args.model_name_or_path = default or self.pretrain

    @property
    def workers(self) -> dict[str, WorkerConfig]:
        """The configured roles by name, absent optional roles left out."""
        roles = {
            "actor_train": self.actor_train,
            "actor_infer": self.actor_infer,
            "critic": self.critic,
            "reference": self.reference,
        }
        return {role: worker for role, worker in roles.items() if worker is not None}

    @property
    def built_roles(self) -> dict[str, WorkerConfig]:
        """The roles the pipeline builds workers for: the actor and its engine always, the critic
        for adv_estimator "gae", the reference when the loss has a KL term; the engine alone in a
        rollout-only run."""
        if self.rollout_only:
            return {"actor_infer": self.actor_infer}
        roles = {"actor_train": self.actor_train, "actor_infer": self.actor_infer}
        if self.adv_estimator == "gae":
            roles["critic"] = self.critic
        if self.uses_kl:
            roles["reference"] = self.reference
        return cast(dict[str, WorkerConfig], roles)  # the validators require each role returned here

    @property
    def device_layout(self) -> dict:
        """What `roll.distributed.placement` plans from, for the roles the pipeline builds: each
        role's `device_mapping`, engine and `world_size`, and the inference replicas."""
        roles = self.built_roles
        return {
            "mappings": {role: worker.device_mapping for role, worker in roles.items()},
            "strategies": {role: worker.strategy_args.strategy_name for role, worker in roles.items()},
            "world_sizes": {role: worker.world_size for role, worker in roles.items()},
            "inference_replicas": self.inference_replicas,
        }

    @property
    def rollout_only(self) -> bool:
        """No `actor_train`: generate and score on `train_env_manager`'s envs, never train."""
        return self.actor_train is None

    @property
    def inference_replicas(self) -> int:
        """Processes serving actor_infer: `strategy_config.num_replicas` when set, else one per device
        of its `device_mapping` (one on CPU)."""
        options = self.actor_infer.strategy_args.strategy_config
        if "num_replicas" in options:
            return options["num_replicas"]
        return len(self.actor_infer.device_mapping or [None])

    @property
    def checkpoint_dir(self) -> str:
        """The dir whose `checkpoints/` holds the run's checkpoints: `checkpoint_config.output_dir`,
        else `output_dir`."""
        return self.checkpoint_config.output_dir or self.output_dir

    @property
    def tensorboard_dir(self) -> str:
        """Where TensorBoard events go: `tracker_kwargs.log_dir` with track_with tensorboard, else
        `logging_dir`."""
        log_dir = self.tracker_kwargs.log_dir if self.track_with == "tensorboard" else None
        return log_dir or self.logging_dir

    @property
    def env_managers(self) -> dict[str, EnvManagerConfig]:
        """The configured env managers by key ("train_env_manager", "val_env_manager")."""
        managers = {
            "train_env_manager": self.train_env_manager,
            "val_env_manager": self.val_env_manager,
        }
        return {name: manager for name, manager in managers.items() if manager is not None}

    @property
    def train_groups_per_step(self) -> int:
        """Complete env groups consumed by one training step."""
        return self.rollout_batch_size // self.train_env_manager.group_size

    @property
    def val_groups_per_eval(self) -> int:
        """Complete env groups run by one validation (0 without a validation manager)."""
        if self.val_env_manager is None:
            return 0
        return self.val_batch_size // self.val_env_manager.group_size

    @property
    def sample_mode(self) -> SampleMode:
        """How training episodes become samples (`train_env_manager.env_manager_type`): the one
        place the pipeline and these checks read it."""
        return SampleMode(self.train_env_manager.env_manager_type)

    @property
    def uses_kl_penalty(self) -> bool:
        """Whether the rewards carry the KL penalty (`init_kl_coef` / `target_kl`)."""
        return self.init_kl_coef > 0 or self.target_kl is not None

    @property
    def uses_kl(self) -> bool:
        """Whether the rewards or the loss have a KL term, hence whether the reference model is run."""
        return self.uses_kl_penalty or self.use_kl_loss

    def generating_args_for(self, manager: EnvManagerConfig) -> GeneratingArgs:
        """Sampling settings of a manager's requests: `actor_infer.generating_args` with the keys
        that the manager's `generating_args` sets explicitly replaced."""
        base = self.actor_infer.generating_args
        override = manager.generating_args
        if override is None:
            return base
        explicit = {key: getattr(override, key) for key in override.model_fields_set}
        return base.model_copy(update=explicit)
