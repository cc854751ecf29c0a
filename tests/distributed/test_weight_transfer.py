"""Which way the actor's weights go to the engines (`roll.distributed.weight_transfer`), decided on
hand-written layouts; the envelope they travel in, pickled as Ray does, on CPU (where a tensor
travels as itself); and an `hf` inference worker loading weights from it in place. The CUDA IPC
handles themselves need a GPU: the GPU lane checks them (benchmarks/gpu/gpu_e2e.py, `sync/cuda_ipc`)."""

from __future__ import annotations

import asyncio
import pickle
from types import SimpleNamespace

import pytest
import torch

from roll.distributed.placement import plan_devices
from roll.distributed.weight_transfer import CPU_COPY, CUDA_IPC, IpcWeights, choose_sync_path, share_state
from roll.distributed.workers.inference import InferenceWorker
from roll.models.tiny import build_tiny_model
from roll.pipeline.setup.sync_path import sync_path

SHARED = dict(trainer_ranks=1, trainer_strategy="torch_train", lora=False, engine_strategy="hf_infer")


@pytest.mark.parametrize(
    ("trainer", "engines", "changes", "path"),
    [
        ((0, None), [(0, None)], {}, CUDA_IPC),
        ((3, "n1"), [(3, "n1"), (3, "n1")], {}, CUDA_IPC),  # two replicas on the trainer's GPU
        ((None, None), [(None, None)], {}, CPU_COPY),  # a CPU run
        ((0, None), [(1, None)], {}, CPU_COPY),  # engine on another GPU
        ((0, None), [(0, None), (1, None)], {}, CPU_COPY),  # one replica elsewhere
        ((0, "n1"), [(0, "n2")], {}, CPU_COPY),  # GPU 0 of another node
        ((0, None), [], {}, CPU_COPY),
        ((0, None), [(0, None)], {"trainer_ranks": 2}, CPU_COPY),
        ((0, None), [(0, None)], {"lora": True}, CPU_COPY),  # merged weights are new tensors
        ((0, None), [(0, None)], {"trainer_strategy": "deepspeed_train"}, CPU_COPY),  # shards to gather
        ((0, None), [(0, None)], {"engine_strategy": "vllm"}, CPU_COPY),
    ],
)
def test_the_path_chosen_for_each_layout(trainer, engines, changes, path):
    assert choose_sync_path(trainer, engines, **{**SHARED, **changes}) == path


def role(strategy: str, lora_rank: int | None = None):
    return SimpleNamespace(
        strategy_args=SimpleNamespace(strategy_name=strategy), model_args=SimpleNamespace(lora=lora_rank)
    )


@pytest.mark.parametrize(
    ("actor_mapping", "strategy", "lora", "path"),
    [([0], "torch", None, CUDA_IPC), ([1], "torch", None, CPU_COPY), ([0], "torch", {"rank": 8}, CPU_COPY)],
)
def test_the_run_reads_its_path_from_config_and_plan(actor_mapping, strategy, lora, path):
    """ROLL's short names ("torch", "hf") are read canonically; the plan is for 2 GPUs here."""
    mappings = {"actor_train": actor_mapping, "actor_infer": [0]}
    plan = plan_devices(mappings, strategies={"actor_train": strategy}, inference_replicas=1, visible_gpus=2)
    cfg = SimpleNamespace(actor_train=role(strategy, lora), actor_infer=role("hf"))
    assert sync_path(cfg, plan) == path


def test_a_cpu_envelope_arrives_as_equal_tensors_and_is_let_go():
    state = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(3)}
    envelope = pickle.loads(pickle.dumps(share_state(state)))
    opened = envelope.open()
    assert set(opened) == {"w", "b"} and torch.equal(opened["w"], state["w"]) and torch.equal(opened["b"], state["b"])
    IpcWeights.close(opened)
    assert opened == {}


def test_an_inference_worker_loads_an_envelope_into_its_own_parameters(tmp_path):
    """The engine's Parameter objects (and so their storage, where captured CUDA graphs point) stay."""
    path = build_tiny_model(str(tmp_path / "m"), corpus=["You are P."], seed=3)
    worker = InferenceWorker(path, num_threads=1)
    before = {name: p for name, p in worker.engine.model.named_parameters()}
    new = {name: torch.full_like(t, 0.5) for name, t in worker.engine.model.state_dict().items()}
    assert asyncio.run(worker.update_weights(pickle.loads(pickle.dumps(share_state(new))), version=4)) == 4
    after = dict(worker.engine.model.named_parameters())
    assert all(after[name] is before[name] and bool((after[name] == 0.5).all()) for name in before)
    assert worker.get_stats()["policy_version"] == 4
