"""ROLL's rollout_mock (record / replay a step's rollout) and rollout_dump_dir
(roll.pipeline.phases.recorded_rollout)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from roll.configs import ConfigError
from roll.configs.rollout import RolloutMock
from roll.core.records import Trajectory
from roll.pipeline.checks.resources import check_recordings
from roll.pipeline.phases.recorded_rollout import RecordedRollout, RecordingMissing, dump_trajectories, recorded

REPO = Path(__file__).parents[2]
RUNS = REPO / "tests" / "configs" / "roll_dialect" / "runs"


def traj(tag: str, rewards: list[float]) -> Trajectory:
    return Trajectory(
        tag=tag,
        traj_group_id="g",
        traj_id=f"{tag}-0",
        env_seed=7,
        step_rewards=rewards,
        success=False,
        stop_reason="max_steps",
        policy_version=0,
        num_actions=len(rewards),
        num_valid_actions=0,
        token_ids=[1, 2, 3],
        response_mask=[0, 1, 1],
        infer_logprobs=[0.0, -0.5, -0.25],
    )


class FakeScheduler:
    def __init__(self, mode="train"):
        self.mode, self.calls, self.workers = mode, [], ["w"]

    def collect(self, step, num_groups, keep_frames=False, **kwargs):
        self.calls.append(("collect", step, num_groups, kwargs))
        return [traj("Lake", [0.5, -0.1]), traj("Box", [1.0])], ["env crashed"]

    def dispatch(self, step, num_groups, keep_frames=False):
        self.calls.append(("dispatch", step))


def test_dump_records_what_collect_returned_and_mock_replays_it_without_playing(tmp_path):
    live = FakeScheduler()
    trajs, dropped = RecordedRollout(live, str(tmp_path), replay=False).collect(3, 2, policy_version=2)
    assert (tmp_path / "train" / "step_000003.json").is_file()  # ROLL's layout, JSON not pickle
    assert live.calls == [("collect", 3, 2, {"policy_version": 2})]

    idle = FakeScheduler()
    replay = RecordedRollout(idle, str(tmp_path), replay=True)
    again, dropped_again = replay.collect(3, 2, policy_version=9)
    replay.dispatch(4, 2)
    assert idle.calls == []  # nothing played, nothing dispatched ahead
    assert again == trajs and dropped_again == dropped == ["env crashed"]
    assert [t.episode_reward for t in again] == [pytest.approx(0.4), 1.0]
    assert replay.workers == ["w"]  # everything else is the scheduler's
    with pytest.raises(RecordingMissing, match="no recording of train step 4 .* rollout_mock.mode=dump"):
        replay.collect(4, 2)
    with pytest.raises(RecordingMissing, match="val step 0"):
        RecordedRollout(FakeScheduler("val"), str(tmp_path), replay=True).collect(0, 1)


def test_recorded_wraps_only_an_enabled_mock(tmp_path):
    live = FakeScheduler()
    assert recorded(live, None) is live
    assert recorded(live, RolloutMock(enable=False, mode="mock")) is live
    assert recorded(live, RolloutMock(enable=True, mode="mock", dump_dir=str(tmp_path))).replay
    assert not recorded(live, RolloutMock(enable=True, dump_dir=str(tmp_path))).replay


def test_a_replay_needs_every_training_step_recorded(tmp_path):
    class Cfg:
        max_steps = 2
        rollout_mock = RolloutMock(enable=True, mode="mock", dump_dir=str(tmp_path))

    RecordedRollout(FakeScheduler(), str(tmp_path), replay=False).collect(1, 1)
    with pytest.raises(ConfigError, match=r"^rollout_mock.dump_dir: .* no recording of training step 2 "):
        check_recordings(Cfg)
    RecordedRollout(FakeScheduler(), str(tmp_path), replay=False).collect(2, 1)
    check_recordings(Cfg)  # complete


def test_dump_trajectories_writes_one_json_line_per_trajectory(tmp_path):
    class Tok:
        def decode(self, ids, skip_special_tokens=False):
            return " ".join(f"t{i}" for i in ids)

    path = dump_trajectories(
        str(tmp_path / "d"), 5, [traj("Lake", [0.5]), traj("Box", [1.0, 1.0])], Tok(), prefix="val_"
    )
    assert path.name == "rollout_dump_data.val_step_5.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["tag"], r["episode_reward"], r["step"]) for r in rows] == [("Lake", 0.5, 5), ("Box", 2.0, 5)]
    assert rows[0]["turns"] == [
        {"role": "context", "text": "t1", "num_tokens": 1},
        {"role": "policy", "text": "t2 t3", "num_tokens": 2},
    ]


def _train(tmp_path, name, model, *args):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = tmp_path / name
    proc = subprocess.run(
        [
            sys.executable,
            "examples/start_agentic_pipeline.py",
            "--config_path",
            str(RUNS),
            "--config_name",
            "traj_defaults",
            "+profile=cpu_smoke",
            f"pretrain={model}",
            f"reward_pretrain={model}",
            "max_steps=1",
            "eval_steps=0",
            "actor_train.strategy_args.strategy_name=torch_train",
            f"output_dir={out}",
            f"logging_dir={out}/logs",
            f"tracker_kwargs.log_dir={out}/tb",
            f"checkpoint_config.output_dir={out}/ckpt",
            f"+rollout_mock.dump_dir={tmp_path}/mock",
            "+rollout_mock.enable=true",
            *args,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((out / "metrics.jsonl").read_text().splitlines()[0])


@pytest.mark.ray
def test_a_replayed_rollout_trains_on_the_recorded_trajectories(tiny_model, tmp_path):
    dumped = _train(tmp_path, "dump", tiny_model, "+rollout_mock.mode=dump")
    # another seed would play other env seeds; the replay must not play at all
    mocked = _train(tmp_path, "mock", tiny_model, "+rollout_mock.mode=mock", "seed=11")
    for key in ("train/episode_reward", "train/num_actions", "train/response_tokens", "losses/policy_loss"):
        assert mocked[key] == pytest.approx(dumped[key], abs=1e-6), key


def test_a_recording_is_json_and_round_trips_step_wise_trajectories_exactly():
    from roll.core.records import StepRecord
    from roll.pipeline.phases.recorded_rollout import decode_recording, encode_recording

    steps = [
        StepRecord(step=0, prompt_ids=[5, 6], response_ids=[7], logprobs=[-0.1 - 0.2], reward=1 / 3, state_hash="ab12"),
        StepRecord(
            step=1, prompt_ids=[5, 8], response_ids=[9, 3], logprobs=[-1e-9, -2.5e-7], reward=0.0, state_hash="cd34"
        ),
    ]
    step_wise = Trajectory(
        tag="Lake",
        traj_group_id="g1",
        traj_id="Lake-1",
        env_seed=3,
        step_rewards=[1 / 3, 0.0],
        success=True,
        stop_reason="terminated",
        policy_version=4,
        num_actions=2,
        num_valid_actions=2,
        steps=steps,
        metrics={"fell_in_hole": 0.0},
        policy_versions=[3, 4],
        rollout_s=0.125,
    )
    text = encode_recording([step_wise, traj("Box", [0.5])], ["a cause"])
    assert json.loads(text)["dropped"] == ["a cause"]  # plain JSON: loading it runs no code
    trajs, dropped = decode_recording(text)
    assert trajs == [step_wise, traj("Box", [0.5])] and dropped == ["a cause"]
    assert trajs[0].steps[0].logprobs == [-0.1 - 0.2] and trajs[0].steps[0].reward == 1 / 3  # bit-exact floats
    assert isinstance(trajs[0].steps[1], StepRecord) and trajs[0].oldest_policy_version == 3
