"""Vision-language runs through the CLI: the VL Sokoban example (as its run_*.sh script runs it,
smaller; with each trainer that takes a VL model), ROLL's own
qwen2.5-vl-3B-agentic/agentic_val_sokoban.yaml with `+profile=cpu_smoke`, changed only in where
the tiny VL model and the outputs are, and the VL FrozenLake example trajectory-wise and
step-wise (GiGPO). Each trains a step on the tiny Qwen2.5-VL; the Sokoban runs also write
TensorBoard image panels of validation frames."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

REPO = Path(__file__).resolve().parents[2]
ROLL_VL = REPO / ".." / "shared" / "roll_examples" / "qwen2.5-vl-3B-agentic"  # beside the checkout
pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def vl_model(tmp_path_factory):
    from roll.pipeline.tiny_model import main as build

    return build(["--preset", "vl_sokoban", "--output_dir", str(tmp_path_factory.mktemp("m") / "vl")])


# one step of 2 groups x 2 envs, validation on 2: what both VL example runs share
SMALL = [
    "rollout_batch_size=4",
    "train_env_manager.num_env_groups=2",
    "train_env_manager.group_size=2",
    "val_batch_size=2",
    "val_env_manager.num_env_groups=2",
    "actor_train.training_args.per_device_train_batch_size=2",
    "actor_train.training_args.gradient_accumulation_steps=2",
]


def image_tags(log_dir: Path) -> set[str]:
    tags = set()
    for events in log_dir.rglob("events.out.tfevents.*"):
        accumulator = EventAccumulator(str(events), size_guidance={"images": 0})
        accumulator.Reload()
        tags |= set(accumulator.Tags()["images"])
    return tags


def run(cmd: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "examples/start_agentic_pipeline.py", *cmd],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


TRAINERS = {
    "torch": [],
    "deepspeed": [
        "actor_train.strategy_args.strategy_name=deepspeed_train",
        "+actor_train.strategy_args.strategy_config={zero_optimization: {stage: 3}}",
    ],
    "fsdp2": ["actor_train.strategy_args.strategy_name=fsdp2_train"],
}


@pytest.mark.parametrize(
    "trainer",
    [t if t == "torch" else pytest.param(t, marks=pytest.mark.lane) for t in sorted(TRAINERS)],
)  # the sharded trainers' runs are in .ci/run_lanes (slow): .ci/run keeps under 20 minutes
def test_the_vl_example_trains_and_shows_frames(vl_model, tmp_path, trainer):
    out = tmp_path / "run"
    run(
        [
            "--config_path",
            "vl_sokoban",
            "--config_name",
            "agentic_val_vl_sokoban",
            f"pretrain={vl_model}",
            f"output_dir={out}",
            "max_steps=1",
            "eval_steps=1",
            "save_steps=1",
            *SMALL,
            *TRAINERS[trainer],
        ]
    )
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert "losses/policy_loss" in rows[1] and rows[1]["rollout/dropped_trajectories"] == 0
    assert rows[1]["train/response_tokens"] > 0
    assert {"val/frames/VLSokoban/0", "val/frames/VLSokoban/1"} <= image_tags(out / "tensorboard")
    from roll.models.loading import is_vl_model, load_processor  # the checkpoint is a VL model dir

    checkpoint = out / "checkpoints" / "step_1"
    assert is_vl_model(checkpoint) and type(load_processor(checkpoint)).__name__ == "Qwen2_5_VLProcessor"


@pytest.mark.lane  # .ci/run_lanes (slow); .ci/run runs its pre-start checks (tests/configs/test_vl_checks.py)
@pytest.mark.skipif(not ROLL_VL.is_dir(), reason=f"ROLL's example configs are not at {ROLL_VL}")
def test_rolls_vl_sokoban_config_runs(vl_model, tmp_path):
    run(
        [
            "--config_path",
            str(ROLL_VL),
            "--config_name",
            "agentic_val_sokoban",
            "+profile=cpu_smoke",
            f"pretrain={vl_model}",
            f"reward_pretrain={vl_model}",
            f"output_dir={tmp_path}/out",
            f"logging_dir={tmp_path}/logs",
            f"render_save_dir={tmp_path}/render",
            f"++tracker_kwargs.log_dir={tmp_path}/tb",
            f"++checkpoint_config.output_dir={tmp_path}/ckpt",
            "max_steps=1",
        ]
    )
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and "val/success" in rows[1]
    assert "val/frames/SimpleSokoban/0" in image_tags(tmp_path / "tb")


def frozen_lake_step(tmp_path, config_name: str, *extra: str) -> dict:
    """One training step of a VL FrozenLake example through the CLI, on its tiny model; the
    step's metrics row, checked for what every such run logs."""
    from roll.pipeline.tiny_model import main as build

    model = build(["--preset", "vl_frozen_lake", "--output_dir", str(tmp_path / "vl")])
    out = tmp_path / "run"
    run(
        [
            "--config_path",
            "vl_frozen_lake",
            "--config_name",
            config_name,
            *extra,
            f"pretrain={model}",
            f"output_dir={out}",
            "max_steps=1",
            "eval_steps=1",
            "save_steps=0",
            *SMALL,
        ]
    )
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and "val/success" in rows[1]
    assert "losses/policy_loss" in rows[1] and rows[1]["rollout/dropped_trajectories"] == 0
    assert rows[1]["train/num_actions"] >= 1
    assert rows[1]["rollout/logprob_abs_diff"] < 1e-4  # the actor scores each row with its images, as the engine did
    return rows[1]


@pytest.mark.lane  # a second VL run through the CLI (about 2 minutes loaded): .ci/run has the Sokoban one
def test_the_vl_frozen_lake_example_trains_a_step(tmp_path):
    frozen_lake_step(tmp_path, "agentic_val_vl_frozen_lake")


# in .ci/run: the one run of step samples with images through the whole loop
def test_the_step_wise_vl_frozen_lake_example_trains_a_step_with_gigpo(tmp_path):
    """Step samples with their images through the whole loop: each group's episodes start on one
    map, so GiGPO finds anchor states shared by at least the first steps of a group."""
    row = frozen_lake_step(tmp_path, "agentic_val_vl_frozen_lake_step", "+profile=cpu_smoke", "adv_estimator=gigpo")
    assert row["critic/anchor_nonsingleton_frac"] > 0 and row["critic/anchor_num_groups"] >= 2
