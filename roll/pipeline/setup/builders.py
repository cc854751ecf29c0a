"""The edge where config becomes objects: Ray, placement and the worker actors (the rollout side,
env workers and their scheduler: `roll.pipeline.setup.rollout_builders`).

Classes below this line take plain arguments; only these functions read `PipelineConfig`.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from roll.algorithms.actor_loss import PolicyLossOptions
from roll.algorithms.advantages import AdvantageOptions
from roll.algorithms.pg_variants import PGOptions
from roll.configs.worker import engine_options
from roll.distributed.cluster_plan import plan_cluster_devices
from roll.distributed.cpu_affinity import CpuShare
from roll.distributed.placement import DevicePlan, ProcessPlacement, plan_devices
from roll.distributed.rank_group import RankGroup
from roll.distributed.ranks import data_parallel_ranks
from roll.distributed.strategies.hf.kv_cache import DEFAULT_MAX_CACHED_TOKENS
from roll.distributed.strategies.process_group import STORE_FILE_ENV, fresh_store_file, node_rendezvous_point
from roll.distributed.workers.actor import ActorWorker
from roll.distributed.workers.critic import CriticWorker
from roll.distributed.workers.inference import InferenceWorker
from roll.distributed.workers.reference import ReferenceWorker
from roll.distributed.workers.weight_store import WeightStore
from roll.pipeline.phases.gpu_offload import PhaseResidency
from roll.pipeline.setup import cluster
from roll.pipeline.setup.cpu_shares import pin_workers, process_shares
from roll.utils.call_profile import profiled

logger = logging.getLogger(__name__)

# Every actor asks Ray for 0 CPUs: on a 2-core machine, actors that each hold a CPU while idle
# starve later tasks. The phases are sequential (rollout, then scoring, then training), so each
# worker uses all cores in its own phase through torch threads instead.
_ACTOR_OPTIONS = {"num_cpus": 0}
# A placement group's bundle cannot be empty: each rank of a CPU role holds this sliver of a CPU.
_BUNDLE_CPU = 0.01
# A GPU rank's bundle on a cluster: a sliver of a GPU (the process asks Ray for none, see
# roll.distributed.placement) and of the node's own `node:IP` resource, which pins it there.
_BUNDLE_GPU = 0.01
_BUNDLE_NODE = 0.001
_PLACEMENT_TIMEOUT_S = 300.0
# What an external engine needs to be offloadable when actor_infer shares GPUs with training roles.
_OFFLOADABLE_ENGINE_OPTIONS = {"vllm": {"enable_sleep_mode": True}, "sglang": {"enable_memory_saver": True}}


def init_ray(address: str | None, system_envs: dict[str, str] | None = None) -> bool:
    """A private local Ray on 127.0.0.1, or the cluster at `address` / `RAY_ADDRESS`
    (`roll.pipeline.setup.cluster`); returns whether the run joined a cluster. `system_envs` (ROLL's key)
    are set in the driver and, through the job's runtime_env, in every worker process."""
    return cluster.init_ray(address, system_envs)


def place_workers(cfg) -> DevicePlan:
    """Where each worker process of the run goes on this machine (`roll.distributed.placement`),
    or on a joined cluster's nodes (`roll.distributed.cluster_plan`, from `ray.nodes()`);
    `PlacementError` naming the key when the layout does not fit the GPUs there."""
    layout = cfg.device_layout
    if cluster.joined():
        return plan_cluster_devices(
            **layout,
            nodes=ray.nodes(),
            num_gpus_per_node=cfg.num_gpus_per_node,
            driver_node_id=ray.get_runtime_context().get_node_id(),
            address=cluster.ray_target(cfg.ray_address) or "the cluster",
        )
    visible = 0
    if any(layout["mappings"].values()):  # a CPU run never touches CUDA
        import torch

        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return plan_devices(**layout, visible_gpus=visible, driver_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))


def inference_names(cfg) -> list[str]:
    """The inference workers' actor names in this driver's Ray job, one per replica
    (`cfg.inference_replicas`). Env workers get the
    names, not the handles: a handle among an actor's constructor arguments lives in Ray's object
    store, which a restart of that actor depends on (Ray warns about it); a name is looked up afresh."""
    job = ray.get_runtime_context().get_job_id()
    return [f"roll-inference-{job}-{i}" for i in range(cfg.inference_replicas)]


def build_workers(cfg, residency: PhaseResidency | None = None) -> dict:
    """Actor and (when needed) reference and critic actors (a `RankGroup` for a role of several
    ranks), then the inference replicas (a list), by worker key, each process on its device
    (`residency.plan`; `place_workers` when no `residency` is given), and the run's `WeightStore`.
    Training roles that share GPUs with the engine are offloaded before it is built, so that vLLM
    and SGLang find free the memory they size their KV cache from."""
    residency = residency or PhaseResidency(place_workers(cfg))
    plan = residency.plan
    pins: list = []  # waited for once, at the end
    workers = {"actor": _start_trainer(ActorWorker, cfg, plan, "actor_train", pins)}
    if "reference" in plan.processes:
        workers["reference"] = _start_reference(cfg, plan, pins)
    if "critic" in plan.processes:
        workers["critic"] = _start_trainer(CriticWorker, cfg, plan, "critic", pins)
    residency.attach_workers(workers)
    residency.enter("rollout")  # no call unless a training role shares the engine's GPUs
    workers["weight_store"] = ray.remote(WeightStore).options(name=weight_store_name(), **_ACTOR_OPTIONS).remote()
    workers["inference"] = build_inference(cfg, residency, pins, weight_store=weight_store_name())
    return workers


def _start_trainer(cls, cfg, plan: DevicePlan, role: str, pins: list):
    """The actor or critic role (`cls`) of `cfg.<role>`: the LR schedule spans `max_steps`."""
    worker_cfg = getattr(cfg, role)
    return _start_role(
        cls,
        plan,
        role,
        worker_cfg.model_args.model_name_or_path,
        worker_cfg.training_args,
        total_train_steps=cfg.max_steps,
        seed=cfg.seed,
        dtype=worker_cfg.model_args.dtype,
        **_strategy(worker_cfg),
        attn_implementation=worker_cfg.model_args.attn_implementation,
        features=training_features(worker_cfg),
        system_envs=worker_cfg.system_envs,
        cfg=cfg,
        pins=pins,
    )


def _start_reference(cfg, plan: DevicePlan, pins: list):
    """The reference role: forward passes only, `infer_batch_size` rows at a time."""
    ref = cfg.reference
    return _start_role(
        ReferenceWorker,
        plan,
        "reference",
        ref.model_args.model_name_or_path,
        dtype=ref.model_args.dtype,
        attn_implementation=ref.model_args.attn_implementation,
        micro_batch_size=ref.infer_batch_size or ref.training_args.per_device_train_batch_size,
        budget=training_features(ref)["infer_budget"],
        sequence_packing=ref.use_sequence_packing,
        system_envs=ref.system_envs,
        cfg=cfg,
        pins=pins,
    )


def weight_store_name() -> str:
    """The run's `WeightStore` actor name (a restarted inference worker looks it up by name)."""
    return f"roll-weights-{ray.get_runtime_context().get_job_id()}"


def build_inference(cfg, residency: PhaseResidency, pins: list | None = None, weight_store: str | None = None) -> list:
    """The inference replicas of `actor_infer` on their devices (`residency.plan`), pinned to their
    cores; `pins`: the training roles' pins, waited for together with these; `weight_store`: the
    name of the `WeightStore` a restarted replica loads its weights from (None: a rollout-only run,
    whose initial weights stay current)."""
    plan, pins = residency.plan, pins or []
    infer_cfg = cfg.actor_infer
    options = infer_cfg.strategy_args.strategy_config
    placements = plan.processes["actor_infer"]
    infer_shares = process_shares(cfg, "actor_infer", len(placements))
    # an engine of its own comes back after its process dies, with the last synced weights; one that
    # takes turns on a GPU with a training role does not (its residency could not be rebuilt)
    restart: dict[str, Any] = {} if plan.is_colocated("actor_infer") else {"max_restarts": -1}
    inference = [
        _remote(
            InferenceWorker, placement, name=name, runtime_env_vars=infer_cfg.system_envs, **spot, **restart
        ).remote(
            infer_cfg.model_args.model_name_or_path,
            dtype=infer_cfg.model_args.dtype,
            max_batch_size=int(options.get("max_batch_size", 256)),
            max_cached_tokens=int(options.get("max_cached_tokens", DEFAULT_MAX_CACHED_TOKENS)),
            continuous_batching=bool(options.get("continuous_batching", True)),
            static_decode=options.get("static_decode"),
            attn_implementation=infer_cfg.model_args.attn_implementation,
            batch_wait_ms=float(options.get("batch_wait_ms", 0.0)),
            device=placement.torch_device,
            **_strategy(infer_cfg, offloadable=plan.is_colocated("actor_infer")),
            num_threads=share.num_threads,
            weight_store=weight_store,
            interrupt=cfg.partial_rollout,
        )
        for placement, name, spot, share in zip(
            placements, inference_names(cfg), node_spots("actor_infer", placements), infer_shares, strict=True
        )
    ]
    ray.get(pins + pin_workers(inference, infer_shares))
    residency.attach("actor_infer", inference)
    return inference


def _start_role(
    cls,
    plan: DevicePlan,
    role: str,
    *args,
    system_envs: dict[str, str] | None = None,
    cfg=None,
    pins: list | None = None,
    **kwargs,
):
    """The actor of a one-process role, exactly as before ranks existed; for several ranks one
    actor per rank, forming one torch.distributed group, behind a `RankGroup`. GPU ranks are pinned
    to the driver's node (its GPUs); CPU ranks get a placement group of their own, packed on one
    node locally and spread over the nodes on a cluster. The group is served by rank 0 on its own
    node: a task on rank 0's spot reports that node's address and a port free there, and every
    rank starts with them (`roll.distributed.strategies.process_group`). `system_envs`: the role's
    own environment variables (ROLL's worker-level key). `cfg`: the run's config, whose CPU shares
    (`roll.pipeline.setup.cpu_shares`) set each rank's torch threads and cores; the pins' refs go to
    `pins` for the caller to wait on (None: waited for here)."""
    placements = plan.processes[role]
    shares = process_shares(cfg, role, len(placements)) if cfg is not None else None
    if len(placements) == 1:
        one_threads = {"num_threads": shares[0].num_threads} if shares and shares[0].num_threads else {}
        handle = _remote(cls, placements[0], runtime_env_vars=system_envs, **node_spots(role, placements)[0]).remote(
            *args, device=placements[0].torch_device, **one_threads, **kwargs
        )
        _pinned(pin_workers([handle], shares or [CpuShare()]), pins)
        return handle
    ranks = len(placements)
    spots = _rank_spots(role, placements)
    addr, port = ray.get(
        ray.remote(num_cpus=0)(node_rendezvous_point).options(scheduling_strategy=spots[0]).remote(),
        timeout=_PLACEMENT_TIMEOUT_S,
    )
    threads = None if placements[0].device is not None else max(1, (os.cpu_count() or 1) // ranks)
    if shares and shares[0].num_threads is not None:
        threads = shares[0].num_threads
    model_parallel = {}  # megatron's tensor/pipeline ranks of one data-parallel rank see the same rows
    if kwargs.get("strategy_name") == "megatron":
        options = kwargs.get("strategy_config") or {}
        model_parallel = {
            "tensor_parallel": int(options.get("tensor_model_parallel_size", 1)),
            "pipeline_parallel": int(options.get("pipeline_model_parallel_size", 1)),
        }
    store = {} if cluster.joined() else {STORE_FILE_ENV: fresh_store_file()}  # one machine: no TCP store
    handles = [
        _remote(
            cls, p, env=p.rank_env(ranks, port, addr) | store, runtime_env_vars=system_envs, scheduling_strategy=spot
        ).remote(*args, device=p.torch_device, num_threads=threads, **kwargs)
        for p, spot in zip(placements, spots, strict=True)
    ]
    _pinned(pin_workers(handles, shares or [CpuShare()] * ranks), pins)
    return RankGroup(handles, data_ranks=data_parallel_ranks(ranks, **model_parallel))


def _pinned(refs: list, pins: list | None) -> None:
    """Hand the pins' `refs` to the caller's `pins`, or wait for them now."""
    if pins is None:
        ray.get(refs)
    else:
        pins.extend(refs)


def _rank_spots(role: str, placements) -> list:
    """Where each rank of a role runs: GPU ranks on a cluster in bundles on their planned nodes
    (`node_spots`), locally on the driver's node; CPU ranks in bundle r of a placement group for
    the role (PACK locally, SPREAD over the nodes on a cluster)."""
    if placements[0].node_id is not None:
        return [spot["scheduling_strategy"] for spot in node_spots(role, placements)]
    if placements[0].device is not None:
        return [NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)] * len(placements)
    group = _reserve(role, [{"CPU": _BUNDLE_CPU}] * len(placements), "SPREAD" if cluster.joined() else "PACK")
    return [PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=r) for r in range(len(placements))]


def node_spots(role: str, placements) -> list[dict]:
    """`_remote` options of each process of a role: on a cluster where the plan put its GPUs on
    nodes (`ProcessPlacement.node_id`), bundle r of one placement group for the role, each bundle
    pinned to its process's node by the node's `node:IP` resource (STRICT_PACK when the role sits
    on one node, else PACK); otherwise no options (`_remote`'s defaults: the driver's node)."""
    if placements[0].node_id is None:
        return [{}] * len(placements)
    bundles = [{"GPU": _BUNDLE_GPU, f"node:{p.node_ip}": _BUNDLE_NODE} for p in placements]
    group = _reserve(role, bundles, "STRICT_PACK" if len({p.node_id for p in placements}) == 1 else "PACK")
    return [
        {"scheduling_strategy": PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=r)}
        for r in range(len(placements))
    ]


def _reserve(role: str, bundles: list[dict], strategy: str):
    """A ready placement group of `bundles` for `role`, or a one-line RuntimeError after
    `_PLACEMENT_TIMEOUT_S`."""
    group = placement_group(bundles, name=f"roll-{role}", strategy=strategy)
    try:
        ray.get(group.ready(), timeout=_PLACEMENT_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        raise RuntimeError(
            f"{role}: no room for a placement group of {len(bundles)} processes within "
            f"{_PLACEMENT_TIMEOUT_S:.0f} s (each asks {bundles[0]})"
        ) from None
    return group


def _remote(
    cls,
    placement: ProcessPlacement,
    env: dict[str, str] | None = None,
    runtime_env_vars: dict[str, str] | None = None,
    **options,
):
    """`ray.remote(cls)` with the process's device options and extra environment `env`; a GPU
    process is pinned to the driver's node (its GPUs), unless `options` place it. `runtime_env_vars`
    only add variables (no pinning)."""
    options = {**_ACTOR_OPTIONS, **placement.ray_options(), **options}
    extra = {**(runtime_env_vars or {}), **(env or {})}
    if extra:
        runtime_env = options.setdefault("runtime_env", {})
        runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), **extra}
    if placement.device is not None and "scheduling_strategy" not in options:
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
            ray.get_runtime_context().get_node_id(), soft=False
        )
    return ray.remote(profiled(cls)).options(**options)


def training_features(worker_cfg) -> dict:
    """The strategy features a role's config switches on (`build_train_strategy`'s arguments):
    LoRA, gradient checkpointing (ROLL's `disable_gradient_checkpointing: false`), and the token
    budgets of dynamic batching in training and inference, or sequence packing and its load-balanced
    plans (`PackingBudget`)."""
    from roll.distributed.dynamic_batching import TokenBudget
    from roll.distributed.sequence_packing import PackingBudget

    packing = worker_cfg.use_sequence_packing

    def budget(phase: str):
        plan = worker_cfg.sequence_packing_args.plan("train" if phase == "train" else "forward") if packing else None
        if plan is not None:
            return PackingBudget(**plan)
        options = worker_cfg.dynamic_batching(phase)
        return None if options is None else TokenBudget(**options)

    return {
        "lora": worker_cfg.model_args.lora,
        "gradient_checkpointing": not worker_cfg.model_args.disable_gradient_checkpointing,
        "train_budget": budget("train"),
        "infer_budget": budget("infer"),
        "sequence_packing": packing,
    }


def _strategy(worker_cfg, offloadable: bool = False) -> dict:
    """Engine name and options; `offloadable` adds what an external engine needs to be offloaded."""
    name = worker_cfg.strategy_args.strategy_name
    config = engine_options(worker_cfg.strategy_args.strategy_config)
    if offloadable:
        config.update(_OFFLOADABLE_ENGINE_OPTIONS.get(name, {}))
    return {"strategy_name": name, "strategy_config": config}


def build_loss_options(cfg) -> PolicyLossOptions:
    """The actor's loss, once per run: temperature (`scoring_temperature`), pg_variant and its
    parameters, entropy bonus, aggregation, off-policy weights, KL loss and train/infer correction."""
    tis, correction = cfg.off_policy_correction, cfg.train_infer_correction
    return PolicyLossOptions(
        temperature=scoring_temperature(cfg),
        variant=cfg.actor_train.pg_variant,
        pg=_pg_options(cfg),
        entropy_coef=cfg.entropy_loss_coef,
        entropy_schedule=cfg.entropy_loss_coef_schedule,
        max_steps=cfg.max_steps,
        agg_mode=cfg.loss_agg_mode,
        tis_level=tis.level if tis else None,
        tis_cap=tis.cap if tis else PolicyLossOptions.tis_cap,
        kl_coef=cfg.kl_loss_coef if cfg.use_kl_loss else None,
        kl_kind=cfg.kl_loss_type,
        correction=correction.loss_options() if correction else None,
    )


def build_advantage_options(cfg) -> AdvantageOptions:
    """How the score phase turns rewards into advantages, once per run; step_reinforce normalises
    its step returns by `reward_normalization` (the other estimators normalise the scores before)."""
    return AdvantageOptions(
        estimator=cfg.adv_estimator,
        gamma=cfg.gamma,
        lambd=cfg.lambd,
        norm_by_std=cfg.norm_adv_by_std_in_grpo,
        whiten_advantages=cfg.whiten_advantages,
        advantage_clip=cfg.advantage_clip,
        whiten_rewards=cfg.whiten_rewards,
        kl_kind=cfg.kl_penalty,
        step_reward_gamma=cfg.step_reward_gamma,
        episode_weight=cfg.episode_reward_weight,
        step_weight=cfg.step_reward_weight,
        virtual_score=cfg.virtual_max_score,
        return_norm=cfg.reward_normalization if cfg.adv_estimator == "step_reinforce" else None,
    )


def scoring_temperature(cfg) -> float:
    """The temperature log-probs are taken at: the engine's when it samples, else 1."""
    gen = cfg.actor_infer.generating_args
    return gen.temperature if gen.do_sample and gen.temperature > 0 else 1.0


def _pg_options(cfg) -> PGOptions:
    """The actor's policy-gradient loss parameters: `actor_train`'s pg_variant keys and the PPO
    clip range (`pg_clip_low` / `pg_clip_high`, each `pg_clip` when unset); `dual_clip_loss`'s bound
    is ROLL's 1 + 2 * pg_clip."""
    actor = cfg.actor_train
    return PGOptions(
        clip_low=cfg.pg_clip_low or cfg.pg_clip,
        clip_high=cfg.pg_clip_high or cfg.pg_clip,
        tis_lower_bound=actor.tis_lower_bound,
        tis_upper_bound=actor.tis_upper_bound,
        topr_positive_weight=actor.topr_positive_weight,
        topr_negative_weight=actor.topr_negative_weight,
        cispo_epsilon_low=actor.cispo_epsilon_low,
        cispo_epsilon_high=actor.cispo_epsilon_high,
        cispo_use_unified_mask=actor.cispo_use_unified_mask,
        kimi15_tau=actor.kimi15_tau,
        dual_clip=1.0 + 2.0 * cfg.pg_clip if cfg.dual_clip_loss else None,
    )
