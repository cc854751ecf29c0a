"""Which processes are offloaded and reloaded, and when: the phase helper on forced device plans
(no GPU: the plans are computed for 8 GPUs that are not there, and the worker handles are fakes
that record calls), then the pipeline's own phase methods calling it in the right order around
their Ray calls (sync: the actor's weights are taken first, the engine is awake before they load)."""

from __future__ import annotations

import os

import pytest
import torch
from tensordict import TensorDict

from roll.algorithms.kl import make_kl_controller
from roll.configs import load_config
from roll.configs.roll_compat.dialect import old_logprobs_in_train
from roll.distributed.placement import plan_devices
from roll.distributed.rank_group import RankGroup
from roll.distributed.weight_transfer import CPU_COPY, CUDA_IPC
from roll.pipeline import agentic_pipeline
from roll.pipeline.agentic_pipeline import AgenticPipeline
from roll.pipeline.phases.gpu_offload import PHASE_ROLES, PhaseResidency, fits_together
from roll.pipeline.setup.builders import build_advantage_options, build_loss_options

STRATEGIES = {"actor_train": "torch", "critic": "torch", "reference": "torch", "actor_infer": "hf"}
CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


class FakeHandle:
    """A Ray actor handle stand-in: `handle.method.remote(...)` logs "label.method" and returns
    `returns[method]` (what `ray.get` then hands back, ray.get being the identity here)."""

    def __init__(self, label: str, log: list[str], returns: dict | None = None):
        self.label, self.log, self.returns = label, log, returns or {}

    def __getattr__(self, method: str):
        handle = self

        class Method:
            @staticmethod
            def remote(*args, **kwargs):
                handle.log.append(f"{handle.label}.{method}")
                return handle.returns.get(method)

        return Method()


def residency(mappings: dict, replicas: int, log: list[str], gpus: int = 8) -> PhaseResidency:
    plan = plan_devices(mappings, strategies=STRATEGIES, inference_replicas=replicas, visible_gpus=gpus)
    res = PhaseResidency(plan, get=lambda refs: refs)
    for role, processes in plan.processes.items():
        res.attach(role, [FakeHandle(f"{role}/{p.index}" if len(processes) > 1 else role, log) for p in processes])
    return res


STEP = ["rollout", "score", "train", "sync", "validate", "checkpoint", "rollout", "score"]


def calls_per_phase(res: PhaseResidency, log: list[str], phases: list[str]) -> list[tuple[str, list[str]]]:
    out = []
    for phase in phases:
        start = len(log)
        res.enter(phase)
        out.append((phase, log[start:]))
    return out


def test_fully_colocated_step():
    """Every role on GPU 0 with the engine's first replica; the other 7 replicas are never touched."""
    log: list[str] = []
    res = residency({"actor_train": [0], "actor_infer": list(range(8)), "critic": [0], "reference": [0]}, 8, log)
    assert calls_per_phase(res, log, STEP) == [
        ("rollout", ["actor_train.offload", "critic.offload", "reference.offload"]),
        ("score", ["actor_infer/0.offload", "actor_train.reload", "critic.reload", "reference.reload"]),
        ("train", ["reference.offload"]),
        ("sync", ["actor_train.offload", "critic.offload", "actor_infer/0.reload"]),
        ("validate", []),
        ("checkpoint", ["actor_infer/0.offload", "actor_train.reload", "critic.reload"]),
        ("rollout", ["actor_train.offload", "critic.offload", "actor_infer/0.reload"]),
        ("score", ["actor_infer/0.offload", "actor_train.reload", "critic.reload", "reference.reload"]),
    ]


def test_fits_together_by_hand():
    """Three processes on an 80 GiB GPU: 20 + 30 + 10 reserved + 3 x 1 GiB contexts = 63 <= 64."""
    assert fits_together([20.0, 30.0, 10.0], 80.0)
    assert not fits_together([20.0, 31.5, 10.0], 80.0)  # 64.5 > 0.8 x 80
    assert not fits_together([0.0, 0.0], 0.0)  # no CUDA: size unknown


def test_roles_that_fit_stop_taking_turns_after_one_reload():
    """GPU 0 (actor, engine, reference) fits; GPU 1 (the second replica with the critic) does not:
    only GPU 0's processes stay, each reloaded once when a phase needs it."""
    log: list[str] = []
    res = residency({"actor_train": [0], "actor_infer": [0, 1], "critic": [1], "reference": [0]}, 2, log, gpus=2)
    calls_per_phase(res, log, ["rollout", "score"])
    small, large = {"reserved_peak": 2.0, "total": 80.0}, {"reserved_peak": 40.0, "total": 80.0}
    readings = {("actor_train", 0): small, ("actor_infer", 0): small, ("reference", 0): small}
    readings |= {("actor_infer", 1): large, ("critic", 0): large}
    assert res.stay_if_room(readings) == [0]
    assert calls_per_phase(res, log, ["train", "sync", "rollout", "score", "train", "sync"]) == [
        ("train", []),
        ("sync", ["critic.offload", "actor_infer/0.reload", "actor_infer/1.reload"]),
        ("rollout", []),
        ("score", ["actor_infer/1.offload", "critic.reload"]),
        ("train", []),
        ("sync", ["critic.offload", "actor_infer/1.reload"]),
    ]


def test_memory_is_read_from_gpu_processes_only():
    log: list[str] = []
    res = residency({"actor_train": [0], "actor_infer": [0]}, 1, log, gpus=1)
    assert set(res.read_memory()) == {("actor_train", 0), ("actor_infer", 0)}
    assert log == ["actor_train.memory_gib", "actor_infer.memory_gib"]
    assert residency({"actor_train": None, "actor_infer": None}, 1, log).read_memory() == {}


def test_partial_overlap_only_touches_what_shares_a_device():
    """Engine on 0-1, actor on 1, reference on 2 (shares nothing): only actor and replica 1 swap."""
    log: list[str] = []
    res = residency({"actor_train": [1], "actor_infer": [0, 1], "reference": [2]}, 2, log, gpus=3)
    assert calls_per_phase(res, log, STEP[:4]) == [
        ("rollout", ["actor_train.offload"]),
        ("score", ["actor_infer/1.offload", "actor_train.reload"]),
        ("train", []),
        ("sync", ["actor_train.offload", "actor_infer/1.reload"]),
    ]


def test_training_roles_sharing_a_gpu_without_the_engine_swap_only_the_reference():
    log: list[str] = []
    res = residency({"actor_train": [0], "actor_infer": [1], "critic": [0], "reference": [0]}, 1, log, gpus=2)
    assert calls_per_phase(res, log, STEP) == [
        ("rollout", []),
        ("score", []),
        ("train", ["reference.offload"]),
        ("sync", []),
        ("validate", []),
        ("checkpoint", []),
        ("rollout", []),
        ("score", ["reference.reload"]),
    ]


@pytest.mark.parametrize(
    "mappings",
    [
        {"actor_train": None, "actor_infer": None, "critic": None, "reference": None},
        {"actor_train": [0], "actor_infer": [1], "critic": [2], "reference": [3]},
    ],
    ids=["cpu", "disjoint-gpus"],
)
def test_no_shared_device_means_no_call_at_all(mappings):
    log: list[str] = []
    res = residency(mappings, 1, log, gpus=4)
    for phase in [*PHASE_ROLES, *PHASE_ROLES]:
        res.enter(phase)
    assert log == [] and res.offloaded == set()


def test_every_rank_of_a_role_is_offloaded_and_reloaded():
    """actor_train as two ranks (a RankGroup) on the engine's two GPUs: both leave for the rollout."""
    log: list[str] = []
    strategies = {**STRATEGIES, "actor_train": "fsdp2"}
    plan = plan_devices(
        {"actor_train": [0, 1], "actor_infer": [0, 1]}, strategies=strategies, inference_replicas=2, visible_gpus=2
    )
    res = PhaseResidency(plan, get=lambda refs: refs)
    res.attach_workers(
        {
            "actor": RankGroup([FakeHandle(f"actor_train/{i}", log) for i in range(2)]),
            "inference": [FakeHandle(f"actor_infer/{i}", log) for i in range(2)],
        }
    )
    assert calls_per_phase(res, log, STEP[:4]) == [
        ("rollout", ["actor_train/0.offload", "actor_train/1.offload"]),
        ("score", ["actor_infer/0.offload", "actor_infer/1.offload", "actor_train/0.reload", "actor_train/1.reload"]),
        ("train", []),
        ("sync", ["actor_train/0.offload", "actor_train/1.offload", "actor_infer/0.reload", "actor_infer/1.reload"]),
    ]


# ---- the pipeline's phase methods, with this plan forced: actor and engine share GPU 0 ----------
@pytest.fixture
def pipeline(tmp_path, monkeypatch) -> tuple[AgenticPipeline, list[str]]:
    """An `AgenticPipeline` made without `__init__`: the minimal config, fake workers and rollout
    schedulers that log into one list, `ray.get` the identity, and a residency for a plan that
    puts actor_train and actor_infer on GPU 0 (forced: it is computed for GPUs this machine lacks)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("")
    log: list[str] = []
    p = object.__new__(AgenticPipeline)
    p.cfg = load_config(CONFIG_DIR, "minimal_agentic", [f"pretrain={model}", f"output_dir={tmp_path / 'out'}"])
    p.workers = {
        "actor": FakeHandle(
            "actor", log, {"compute_logprobs": torch.zeros(2, 3), "train": {}, "get_weights": "weights"}
        ),
        "inference": [FakeHandle("inference", log)],
    }
    p.residency = residency({"actor_train": [0], "actor_infer": [0]}, 1, log, gpus=1)
    p.train_rollout = p.val_rollout = FakeHandle("rollout", log)
    p.train_rollout.collect = lambda *args, **kwargs: log.append("rollout.collect") or ([], [])
    p.train_rollout.engine_calls = p.train_rollout.engine_requests = 0  # the scheduler's per-collect counts
    p.train_rollout.ledger = lambda: []  # what a checkpoint keeps of the rollout (nothing in flight)
    p.tracer, p.tokenizer, p.step_wise, p.temperature = None, None, False, 1.0
    p.kl_ctl = make_kl_controller(0.0, None, 100)
    p.loss_options = build_loss_options(p.cfg)
    p.advantage_options = build_advantage_options(p.cfg)
    p.sync_path = CPU_COPY
    p.score_in_turns = False  # roles on a GPU
    p.old_logprobs_in_train = old_logprobs_in_train(p.cfg)  # the default: the actor takes them when training
    monkeypatch.setattr(agentic_pipeline.ray, "get", lambda refs, timeout=None: refs)
    monkeypatch.setattr(agentic_pipeline, "score_batch", lambda *args, **kwargs: {})
    monkeypatch.setattr(agentic_pipeline, "summarize_trajectories", lambda *args: {})
    return p, log


@pytest.mark.parametrize("old_logprobs_in_train", [True, False])
def test_pipeline_phases_offload_and_reload_in_order(pipeline, old_logprobs_in_train):
    """The same turns whether the actor scores its old log-probs in the score phase or takes them
    when training (then the score phase needs no role of GPU 0 and the turns start at train)."""
    p, log = pipeline
    p.old_logprobs_in_train = old_logprobs_in_train
    batch = TensorDict({"infer_logprobs": torch.zeros(2, 3), "response_mask": torch.ones(2, 3)}, batch_size=[2])
    p.rollout(step=1)
    p.score(batch, None)
    p.update(batch, step=1)
    p.sync_weights(version=1)
    p.validate(step=1)
    p.save(step=1)
    assert log == [
        "actor_train.offload",
        "rollout.collect",  # the engine has the GPU for the rollout
        "actor_infer.offload",
        "actor_train.reload",
        *([] if old_logprobs_in_train else ["actor.compute_logprobs"]),
        "actor.train",
        # weights first (CPU copies, before the actor leaves the GPU), then into the awake engine
        "actor.get_weights",
        "actor_train.offload",
        "actor_infer.reload",
        "inference.update_weights",
        "rollout.collect",  # validation on the engine, already awake
        "actor_infer.offload",
        "actor_train.reload",
        "actor.save_checkpoint",
    ]


def test_on_a_shared_gpu_the_engine_copies_from_the_resident_actor(pipeline):
    """CUDA IPC: the engine wakes beside the actor, which stays on the GPU while the engine copies
    from its tensors; the actor leaves only when the next phase (here validation) needs the room."""
    p, log = pipeline
    p.sync_path = CUDA_IPC
    batch = TensorDict({"infer_logprobs": torch.zeros(2, 3), "response_mask": torch.ones(2, 3)}, batch_size=[2])
    p.rollout(step=1)
    p.score(batch, None)
    p.update(batch, step=1)
    del log[:]
    p.sync_weights(version=1)
    p.validate(step=1)
    assert log == [
        "actor_infer.reload",
        "actor.share_weights",
        "inference.update_weights",
        "actor_train.offload",
        "rollout.collect",
    ]
