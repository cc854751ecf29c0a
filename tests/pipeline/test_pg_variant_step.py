"""One actor update through the pipeline's own scoring and update code (`AgenticPipeline.score`,
`.update`) with every pg_variant and the KL loss: real actor and reference workers on a tiny
random Llama, called in-process (no Ray: the handles call the worker directly and `ray.get` is the
identity). Checks the loss is finite, the variant's metrics arrive and the reference is used."""

from __future__ import annotations

import math
import os

import pytest
import torch
from tensordict import TensorDict

from roll.algorithms.kl import make_kl_controller
from roll.configs import load_config
from roll.configs.roll_compat.dialect import old_logprobs_in_train
from roll.core.fields import RowInfo
from roll.distributed.workers.actor import ActorWorker
from roll.distributed.workers.reference import ReferenceWorker
from roll.pipeline import agentic_pipeline
from roll.pipeline.agentic_pipeline import AgenticPipeline
from roll.pipeline.setup.builders import build_advantage_options, build_loss_options
from tests.conftest import save_tiny_llama

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
VOCAB = 24


class LocalHandle:
    """`handle.method.remote(...)` runs `worker.method(...)` here and returns its result."""

    def __init__(self, worker):
        self.worker = worker

    def __getattr__(self, method: str):
        function = getattr(self.worker, method)

        class Method:
            remote = staticmethod(function)

        return Method()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny_llama_pg")
    return save_tiny_llama(path, seed=0, layers=1, vocab_size=VOCAB, max_position_embeddings=32)


def pipeline(model_dir: str, monkeypatch, step_wise: bool, *overrides: str) -> AgenticPipeline:
    monkeypatch.setattr(agentic_pipeline.ray, "get", lambda refs, timeout=None: refs)
    p = object.__new__(AgenticPipeline)
    step = ["train_env_manager.env_manager_type=step", "adv_estimator=gigpo"] if step_wise else []
    p.cfg = load_config(CONFIG_DIR, "minimal_agentic", [f"pretrain={model_dir}", *step, *overrides])
    actor = ActorWorker(model_dir, p.cfg.actor_train.training_args, total_train_steps=2, seed=3, num_threads=1)
    p.workers = {"actor": LocalHandle(actor)}
    if "reference" in p.cfg.built_roles:
        p.workers["reference"] = LocalHandle(ReferenceWorker(model_dir, micro_batch_size=4, num_threads=1))
    p.residency = type("NoResidency", (), {"enter": staticmethod(lambda phase: None)})()
    p.step_wise, p.temperature = step_wise, 1.0
    p.score_in_turns = True  # one CPU machine: the actor's and the reference's passes in turns
    p.old_logprobs_in_train = old_logprobs_in_train(p.cfg)  # by default the actor takes them when training
    p.kl_ctl = make_kl_controller(p.cfg.init_kl_coef, p.cfg.target_kl, p.cfg.kl_horizon)
    p.loss_options = build_loss_options(p.cfg)
    p.advantage_options = build_advantage_options(p.cfg)
    return p


def batch_and_meta(step_wise: bool) -> tuple[TensorDict, RowInfo]:
    """4 rows of 8 tokens (3 prompt, 3..5 generated); one reward on the last generated token.
    Traj-wise: 2 groups of 2 trajectories; step-wise: trajectories t0 (2 steps) and t1, t2."""
    generator = torch.Generator().manual_seed(1)
    lengths = torch.tensor([6, 7, 8, 7])[:, None]
    positions = torch.arange(8)
    attention = (positions < lengths).long()
    response = ((positions >= 3) & (positions < lengths)).float()
    scores = torch.tensor([1.0, 0.0, 1.0, -1.0])
    rewards = torch.zeros(4, 8)
    rewards[torch.arange(4), lengths.squeeze(1) - 1] = scores
    batch = TensorDict(
        {
            "input_ids": torch.randint(1, VOCAB, (4, 8), generator=generator) * attention,
            "attention_mask": attention,
            "response_mask": response,
            "token_level_rewards": rewards,
            "infer_logprobs": torch.full((4, 8), -3.0),
        },
        batch_size=[4],
    )
    if not step_wise:
        return batch, RowInfo(
            traj_group_id=["g0", "g0", "g1", "g1"], traj_id=["t0", "t1", "t2", "t3"], tag=["A"] * 4, scores=scores
        )
    return batch, RowInfo(
        traj_group_id=["g0", "g0", "g0", "g1"],
        traj_id=["t0", "t0", "t1", "t2"],
        tag=["A"] * 4,
        step=[0, 1, 0, 0],
        state_hash=["s0", "s1", "s0", "s0"],
        step_rewards=torch.tensor([0.0, 1.0, 0.0, -1.0]),
        episode_scores=torch.tensor([1.0, 1.0, 0.0, -1.0]),
    )


VARIANT_METRIC = {
    "vanilla": "losses/ratio_mean",
    "ppo": "actor/ppo_ratio_clipfrac",
    "tis": "actor/tis_total_clipfrac",
    "topr": "actor/topr_positive_ratio",
    "cispo": "actor/cispo_total_clipfrac",
    "kimi15": "actor/kimi15_kl_reg",
}
KL_LOSS = ["+reference.strategy_args.strategy_name=torch", "use_kl_loss=true", "kl_loss_coef=0.1"]


@pytest.mark.parametrize("variant", sorted(VARIANT_METRIC))
def test_one_update_per_variant_with_the_kl_loss(variant, model_dir, monkeypatch):
    p = pipeline(model_dir, monkeypatch, False, f"+actor_train.pg_variant={variant}", *KL_LOSS)
    batch, meta = batch_and_meta(step_wise=False)
    score_metrics = p.score(batch, meta)
    assert "critic/kl" not in score_metrics  # no reward-side penalty: the KL is in the loss only
    metrics = p.update(batch, step=1)
    assert math.isfinite(metrics["losses/policy_loss"]) and metrics["actor/grad_norm"] > 0
    assert VARIANT_METRIC[variant] in metrics
    # the same weights scored and trained, so the policy equals the reference: KL 0 exactly-ish
    assert metrics["losses/kl_loss"] == pytest.approx(0.0, abs=1e-6)


def test_step_wise_rows_get_the_kl_loss_and_topr_scores(model_dir, monkeypatch):
    p = pipeline(
        model_dir,
        monkeypatch,
        True,
        "+actor_train.pg_variant=topr",
        *KL_LOSS,
        "+reward_normalization={method: mean_std}",
        "advantage_clip=0.5",
        "reward_clip=5",
    )
    batch, meta = batch_and_meta(step_wise=True)
    score_metrics = p.score(batch, meta)
    assert batch["episode_scores"].tolist() == [1.0, 1.0, 0.0, -1.0]  # raw, before normalisation
    assert float(batch["advantages"].abs().max()) <= 0.5
    assert {"critic/advantage_clip_frac", "critic/reward_clip_frac"} <= set(score_metrics)
    metrics = p.update(batch, step=1)
    assert metrics["actor/topr_positive_ratio"] == 0.5 and metrics["actor/topr_negative_ratio"] == 0.5  # 2 of 4
    assert "losses/kl_loss" in metrics and math.isfinite(metrics["losses/policy_loss"])


def test_without_kl_loss_no_reference_and_no_kl_metric(model_dir, monkeypatch):
    p = pipeline(model_dir, monkeypatch, False, "+actor_train.pg_variant=cispo")
    batch, meta = batch_and_meta(step_wise=False)
    p.score(batch, meta)
    assert "reference" not in p.workers and "ref_logprobs" not in batch.keys()
    assert "losses/kl_loss" not in p.update(batch, step=1)


def test_old_logprobs_from_the_score_phase_or_the_training_call_train_alike(model_dir, monkeypatch):
    """enable_old_logprobs_recompute: true scores them in the score phase, false (the default)
    leaves them to the actor's training call, which also scores the 2 rows outside its first
    mini-batch of 2; the step is the same either way and rollout/logprob_abs_diff (|engine -3.0 -
    trainer|) is reported once."""
    minibatches = ["actor_train.training_args.per_device_train_batch_size=1", "ppo_epochs=2"]
    runs = {}
    for recompute in (True, False):
        p = pipeline(
            model_dir, monkeypatch, False, f"enable_old_logprobs_recompute={str(recompute).lower()}", *minibatches
        )
        assert p.old_logprobs_in_train is not recompute
        batch, meta = batch_and_meta(step_wise=False)
        score_metrics = p.score(batch, meta)
        assert ("old_logprobs" in batch.keys()) is recompute
        metrics = p.update(batch, step=1)
        assert ("rollout/logprob_abs_diff" in score_metrics) is recompute
        assert ("rollout/logprob_abs_diff" in metrics) is not recompute
        runs[recompute] = score_metrics | metrics
    for key in ("losses/policy_loss", "losses/approx_kl", "actor/grad_norm", "rollout/logprob_abs_diff"):
        assert runs[False][key] == pytest.approx(runs[True][key], rel=1e-4, abs=1e-7), key
    assert runs[False]["losses/approx_kl"] != 0  # the later mini-batches saw moved weights
    actor = ActorWorker(model_dir, p.cfg.actor_train.training_args, total_train_steps=2, seed=3, num_threads=1)
    trainer = actor.compute_logprobs(batch, 1.0)
    gap = ((batch["infer_logprobs"] - trainer).abs() * batch["response_mask"]).sum() / batch["response_mask"].sum()
    assert runs[False]["rollout/logprob_abs_diff"] == pytest.approx(float(gap), rel=1e-5)


def test_dual_clip_loss_reaches_the_actor_loss(model_dir, monkeypatch):
    p = pipeline(model_dir, monkeypatch, False, "+dual_clip_loss=true", "pg_clip=0.3")
    assert p.loss_options.pg.dual_clip == pytest.approx(1.6)  # ROLL's bound 1 + 2 * pg_clip
    batch, meta = batch_and_meta(step_wise=False)
    p.score(batch, meta)
    assert "actor/dual_clipfrac" in p.update(batch, step=1)


def test_critic_warmup_leaves_the_actor_alone_for_its_first_steps(model_dir, monkeypatch):
    # ROLL trains the actor when critic_warmup <= global_step (0-based); roll's steps count from 1.
    p = pipeline(model_dir, monkeypatch, False, "+critic_warmup=2")
    batch, meta = batch_and_meta(step_wise=False)
    assert p.old_logprobs_in_train
    warm_up = p.score(batch.clone(), meta, step=2)  # the actor does not train: the pass gives the gap metric
    assert "rollout/logprob_abs_diff" in warm_up
    p.score(batch, meta, step=3)
    assert "old_logprobs" not in batch.keys()
    before = {k: v.clone() for k, v in p.workers["actor"].worker.get_weights().items()}
    assert p.update(batch, step=1) == {} and p.update(batch, step=2) == {}
    after = p.workers["actor"].worker.get_weights()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert "losses/policy_loss" in p.update(batch, step=3)


def test_save_keeps_max_ckpt_to_keep_checkpoints(model_dir, monkeypatch, tmp_path):
    p = pipeline(model_dir, monkeypatch, False, "+max_ckpt_to_keep=2", f"output_dir={tmp_path}")
    p.train_rollout = type("NoRollout", (), {"ledger": staticmethod(lambda: [])})()  # nothing in flight
    for step in (1, 2, 3):
        p.save(step)
    kept = sorted(d.name for d in (tmp_path / "checkpoints").iterdir() if d.is_dir())
    assert kept == ["step_2", "step_3"] and (tmp_path / "checkpoints" / "latest").read_text() == "step_3"


def test_a_scheduled_entropy_bonus_trains_as_its_steps_weight(model_dir, monkeypatch):
    # cosine over max_steps 4: step 3 trains at 0.1 x (1 + cos(pi x 2/4)) / 2 = 0.05, the same update
    # as a constant 0.05; step 1 at the full 0.1
    runs = {}
    for name, overrides in {
        "cosine": ["entropy_loss_coef=0.1", "entropy_loss_coef_schedule=cosine", "max_steps=4"],
        "constant": ["entropy_loss_coef=0.05", "max_steps=4"],
    }.items():
        p = pipeline(model_dir, monkeypatch, False, *overrides)
        batch, meta = batch_and_meta(step_wise=False)
        p.score(batch, meta)
        runs[name] = p.update(batch, step=3)
    assert runs["cosine"]["actor/entropy_loss_coef"] == pytest.approx(0.05)
    assert runs["constant"]["actor/entropy_loss_coef"] == 0.05
    assert runs["cosine"]["actor/grad_norm"] == pytest.approx(runs["constant"]["actor/grad_norm"], rel=1e-6)
    p = pipeline(
        model_dir, monkeypatch, False, "entropy_loss_coef=0.1", "entropy_loss_coef_schedule=cosine", "max_steps=4"
    )
    batch, meta = batch_and_meta(step_wise=False)
    p.score(batch, meta)
    assert p.update(batch, step=1)["actor/entropy_loss_coef"] == pytest.approx(0.1)
