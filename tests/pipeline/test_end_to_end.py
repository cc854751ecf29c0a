"""The whole pipeline through real Ray actors and the real tiny model, a few steps at a time."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.ray

# Small but complete: 2 groups x 4 envs per step, validation on 4 fixed maps.
SMALL = [
    "rollout_batch_size=8",
    "train_env_manager.num_env_groups=2",
    "train_env_manager.group_size=4",
    "val_batch_size=4",
    "val_env_manager.num_env_groups=4",
    "eval_steps=2",
    "save_steps=2",
    "actor_train.training_args.per_device_train_batch_size=4",
    "actor_train.training_args.gradient_accumulation_steps=1",
]


def run_cli(tiny_model, out_dir, *extra):
    cmd = [
        sys.executable,
        "examples/start_agentic_pipeline.py",
        "--config_path",
        "frozen_lake",
        "--config_name",
        "agent_val_frozen_lake",
        f"pretrain={tiny_model}",
        f"output_dir={out_dir}",
        *SMALL,
        *extra,
    ]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)


def read_metrics(out_dir):
    return [json.loads(line) for line in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]


def test_cli_trains_logs_and_checkpoints(tiny_model, tmp_path):
    out = tmp_path / "run"
    proc = run_cli(tiny_model, out, "max_steps=3", f"render_save_dir={out / 'frames'}", "rollout_filter_ratio=0.5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for key in (
        "train/success",
        "train/episode_reward",
        "losses/policy_loss",
        "losses/approx_kl",
        "losses/entropy",
        "rollout/dropped_trajectories",
        "time/step_s",
    ):
        assert all(key in r for r in rows[1:]), key
    assert {"val/success"} <= rows[0].keys() and "val/success" in rows[2] and "val/success" in rows[3]
    assert all(r["rollout/dropped_trajectories"] == 0 for r in rows[1:])
    # idle accounting: per role, compute + sync + idle is the step; the actor trains in the train
    # phase, the engine generates in the rollout phase (a synchronous run) and both take part in the sync
    for r in rows[1:]:
        for role in ("actor_train", "actor_infer"):
            parts = [r[f"time/{kind}/{role}"] for kind in ("compute", "sync", "idle")]
            assert min(parts) >= 0 and sum(parts) == pytest.approx(r["time/step_s"], rel=1e-9), (role, parts)
        assert 0 < r["time/compute/actor_train"] <= r["time/train_s"]
        assert 0 < r["time/compute/actor_infer"] <= r["time/rollout_s"]
        assert r["time/sync/actor_train"] > 0 and r["time/sync/actor_infer"] > 0
        assert 0 < r["time/idle_fraction"] < 1
        assert r["rollout/interrupted_requests"] == r["rollout/discarded_tokens"] == 0  # nothing runs at a sync
    assert all(r["rollout/kept_trajectories"] == 4 for r in rows[1:])  # 1 of 2 groups of 4
    # the env worker's requests travel batched: one Ray call carries every request of a turn
    assert all(0 < r["rollout/engine_calls"] < r["rollout/engine_requests"] for r in rows[1:])
    assert all(r["val/engine_calls"] > 0 for r in rows if "val/success" in r)
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    frames = sorted((out / "frames" / "step_2").glob("*.txt"))
    assert len(frames) == 4  # one file per validation episode
    assert "reward" in frames[0].read_text() and "P" in frames[0].read_text()
    gifs = sorted((out / "frames" / "step_2").glob("*.gif"))  # FrozenLake has images: PNGs and a GIF
    assert len(gifs) == 4 and list((out / "frames" / "step_2").glob("*/frame_000.png"))
    ckpts = out / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == "step_3"
    # where every process landed: a local run is one node, on 127.0.0.1, all on CPU
    placement = json.loads((out / "placement.json").read_text())
    assert placement["nodes"] == ["127.0.0.1"]
    roles = [(p["role"], p["rank"]) for p in placement["processes"]]
    assert ("actor_train", 0) in roles and ("actor_infer", 0) in roles and ("env_worker:train", 0) in roles
    assert ("env_worker:val", 0) in roles
    assert all(p["devices"] == "cpu" and len(p["node_id"]) == 56 for p in placement["processes"])
    assert (ckpts / "step_2" / "trainer_state.json").is_file()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(ckpts / "step_3", local_files_only=True)
    tok = AutoTokenizer.from_pretrained(ckpts / "step_3", local_files_only=True)
    assert model.config.vocab_size == len(tok)


def test_resumed_run_reproduces_the_uninterrupted_run(tiny_model, tmp_path):
    """Resume from the uninterrupted run's step-2 checkpoint (what a run killed after step 2
    leaves) into a fresh directory: steps 3 and 4 must match, weights, optimizer, LR schedule
    (cosine over max_steps), KL controller and data order all restored."""
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    first = run_cli(tiny_model, full, "max_steps=4")
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_cli(tiny_model, resumed, "max_steps=4", f"resume_from_checkpoint={full / 'checkpoints' / 'step_2'}")
    assert second.returncode == 0, second.stderr[-3000:]
    a, b = read_metrics(full), read_metrics(resumed)
    assert [r["step"] for r in b] == [3, 4]
    keys = [
        "train/episode_reward",
        "train/success",
        "losses/policy_loss",
        "losses/entropy",
        "losses/approx_kl",
        "actor/lr",
        "val/success",
    ]
    for ra, rb in zip(a[3:], b):
        for k in keys:
            if k in ra:
                assert rb[k] == pytest.approx(ra[k], rel=1e-4, abs=1e-6), (ra["step"], k)


def test_trajectory_wise_ppo_with_critic_and_kl(tiny_model, tmp_path):
    """The StarPO example with GAE (critic worker), a KL penalty (reference worker) and batch-whitened
    episode scores (reward_normalization, a section the YAML leaves out)."""
    out = tmp_path / "traj"
    cmd = [
        sys.executable,
        "examples/start_agentic_pipeline.py",
        "--config_path",
        "frozen_lake",
        "--config_name",
        "agent_val_frozen_lake_traj",
        f"pretrain={tiny_model}",
        f"output_dir={out}",
        *SMALL,
        "max_steps=2",
        "adv_estimator=gae",
        "critic.strategy_args.strategy_name=torch",
        "reference.strategy_args.strategy_name=torch",
        "init_kl_coef=0.05",
        "target_kl=0.01",
        "reward_normalization.grouping=batch",
        "reward_normalization.norm_mean_type=batch",
        "reward_normalization.norm_std_type=batch",
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2]
    for key in ("losses/value_loss", "critic/kl", "critic/kl_coef", "losses/policy_loss"):
        assert all(key in r for r in rows[1:]), key
    assert rows[1]["critic/kl"] == pytest.approx(0.0, abs=1e-6)  # step 1: actor == reference
    assert rows[1]["critic/score_mean"] == pytest.approx(0.0, abs=1e-5)  # whitened, no KL yet
    assert rows[2]["critic/kl_coef"] != 0.05  # the adaptive controller moved
    assert (out / "checkpoints" / "step_2" / "critic" / "config.json").is_file()


def test_async_generation_runs_one_step_ahead_with_bounded_staleness(tiny_model, tmp_path):
    """k = 1: step t+1's groups generate while step t trains, so their turns are at most one
    version behind the weights being trained; truncated IS corrects for it (sequence level).
    Validation and checkpoints work as in sync mode, and a resumed run regenerates what was in
    flight (its first step runs nothing ahead, hence staleness 0). Each group runs one redundant
    env, so each step leaves out exactly one episode per group."""
    out = tmp_path / "async"
    flags = (
        "async_generation_ratio=1",
        "off_policy_correction.level=sequence",
        "off_policy_correction.cap=2.0",
        "train_env_manager.group_size_redundancy=1",
    )
    proc = run_cli(tiny_model, out, "max_steps=3", *flags)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert rows[1]["rollout/staleness_max"] == 0  # nothing ran ahead of the first step
    for r in rows[1:]:
        assert 0 <= r["rollout/staleness_mean"] <= r["rollout/staleness_max"] <= 1
        assert 0 <= r["rollout/mixed_version_trajectories"] <= 1
        assert r["rollout/stale_dropped_groups"] == 0 and r["rollout/dropped_trajectories"] == 0
        assert r["rollout/redundant_trajectories"] == 2 and r["rollout/kept_trajectories"] == 8
        assert 0 < r["actor/tis_weight_mean"] <= 2.0 and 0 <= r["actor/tis_clipped_frac"] <= 1
    assert "val/success" in rows[2] and "val/success" in rows[3]
    resumed = run_cli(
        tiny_model,
        tmp_path / "resumed",
        "max_steps=3",
        *flags,
        f"resume_from_checkpoint={out / 'checkpoints' / 'step_2'}",
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    [row] = read_metrics(tmp_path / "resumed")
    assert row["step"] == 3 and row["rollout/staleness_max"] == 0


def test_ten_percent_env_faults_lose_no_step_and_count_every_dropped_trajectory(tiny_model, tmp_path):
    """Every env.step raises (4%), hangs past the 1 s step timeout (3%) or returns garbage (3%):
    the run still logs every step, and each dropped trajectory is counted and logged with its
    cause. The faults follow the seeds, so the same trajectories fail every time."""
    out, fi = tmp_path / "faults", "custom_envs.FrozenLake.env_config.fault_injection"
    proc = run_cli(
        tiny_model,
        out,
        "max_steps=3",
        f"{fi}.raise_p=0.04",
        f"{fi}.hang_p=0.03",
        f"{fi}.garbage_p=0.03",
        f"{fi}.seed=5",
        "train_env_manager.env_step_timeout_s=1",
        "val_env_manager.env_step_timeout_s=1",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    logged = [line for line in proc.stderr.splitlines() if ": dropped a trajectory: " in line]
    train_logged = [line for line in logged if "validation at step" not in line]
    dropped = sum(r["rollout/dropped_trajectories"] for r in rows[1:])
    val_dropped = sum(r["val/dropped_trajectories"] for r in rows if "val/dropped_trajectories" in r)
    assert dropped > 0 and len(train_logged) == dropped and len(logged) == dropped + val_dropped
    for cause in ("InjectedEnvError", "env.step exceeded 1.0s", "MalformedEnvOutput"):
        assert any(cause in line for line in logged), cause
    assert all(r["rollout/kept_trajectories"] > 0 for r in rows[1:])
