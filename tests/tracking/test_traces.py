"""Rollout traces: one JSON line per trajectory with its decoded turns and tool calls, a few as
TensorBoard text, and mlflow only when asked for and installed."""

import json
import logging
import sys
import types

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from roll.core.records import StepRecord, Trajectory
from roll.models.tiny import build_tiny_tokenizer
from roll.tracking import Tracker
from roll.tracking.traces import RolloutTracer, as_markdown, trace_record

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "2"}}</tool_call>'
TOK = build_tiny_tokenizer(
    ["What is two tool result", CALL],
    ["<tool_call>", "</tool_call>", '"name"', '"arguments"', '"calculator"', '"expression"'],
)


def ids(text):
    return TOK.encode(text, add_special_tokens=False)


def traj(i: int) -> Trajectory:
    """prompt (mask 0), a tool call (mask 1), the tool result (mask 0), the answer (mask 1)."""
    parts = [
        (ids("<|im_start|>user\nWhat is two<|im_end|>\n<|im_start|>assistant\n"), 0),
        (ids(CALL), 1),
        (ids("<|im_end|>\n<|im_start|>tool\nresult<|im_end|>\n<|im_start|>assistant\n"), 0),
        (ids("2"), 1),
    ]
    token_ids = [t for p, _ in parts for t in p]
    mask = [m for p, m in parts for _ in p]
    return Trajectory(
        tag="Math",
        traj_group_id="g",
        traj_id=f"g-{i}",
        env_seed=7,
        step_rewards=[0.0, 1.0],
        success=True,
        stop_reason="terminated",
        policy_version=4,
        num_actions=2,
        num_valid_actions=2,
        token_ids=token_ids,
        response_mask=mask,
        infer_logprobs=[0.0] * len(token_ids),
        turn_end_positions=[],
        metrics={"tool_calls": 1.0},
        policy_versions=[3, 4],
        rollout_s=0.25,
    )


def test_a_record_has_the_turns_tool_calls_and_counts():
    record = trace_record(traj(0), TOK, step=5)
    assert [t["role"] for t in record["turns"]] == ["context", "policy", "context", "policy"]
    assert record["turns"][3]["text"] == "2" and record["turns"][1]["num_tokens"] == len(ids(CALL))
    # the tiny word-level tokenizer decodes with spaces between tokens
    assert record["tool_calls"] == [{"name": "calculator", "arguments": {"expression": " 2 "}, "error": None}]
    assert (record["step"], record["episode_reward"], record["policy_versions"]) == (5, 1.0, [3, 4])
    assert record["rollout_s"] == 0.25
    assert record["num_generated_tokens"] == len(ids(CALL)) + 1 and record["num_tokens"] == len(traj(0).token_ids)
    assert "**g-0** (Math, seed 7): reward 1, terminated, policy v4" in as_markdown(record)


def test_step_wise_trajectories_trace_each_step():
    tr = traj(0)
    tr.token_ids, tr.response_mask = [], []
    tr.steps = [StepRecord(0, ids("What is two"), ids("2"), [0.0], 1.0, "h")]
    (turn,) = trace_record(tr, TOK, 1)["turns"]
    assert turn == {"prompt": "What is two", "response": "2", "reward": 1.0}


def test_tracer_writes_a_file_per_step_and_text_to_tensorboard(tmp_path):
    with Tracker(tmp_path / "out", tmp_path / "tb") as tracker:
        tracer = RolloutTracer(tmp_path / "out", TOK, tracker, samples_to_tensorboard=2)
        path = tracer.write(3, [traj(i) for i in range(3)])
        tracer.write(3, [traj(0)], prefix="val")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert path.name == "step_3.jsonl" and [r["traj_id"] for r in lines] == ["g-0", "g-1", "g-2"]
    assert (tmp_path / "out" / "traces" / "val_step_3.jsonl").is_file()
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0}).Reload()
    assert sorted(acc.Tags()["tensors"]) == [
        "traces/train/0/text_summary",
        "traces/train/1/text_summary",
        "traces/val/0/text_summary",
    ]
    text = acc.Tensors("traces/train/1/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "**g-1**" in text


def test_mlflow_gets_the_file_when_installed_and_is_skipped_otherwise(tmp_path, monkeypatch, caplog):
    logged = []
    monkeypatch.setitem(
        sys.modules,
        "mlflow",
        types.SimpleNamespace(log_artifact=lambda path, artifact_path: logged.append((path, artifact_path))),
    )
    path = RolloutTracer(tmp_path, TOK, mlflow=True).write(1, [traj(0)])
    assert logged == [(str(path), "traces")]
    monkeypatch.setitem(sys.modules, "mlflow", None)  # import fails
    with caplog.at_level(logging.WARNING):
        RolloutTracer(tmp_path, TOK, mlflow=True).write(2, [traj(0)])
    assert "mlflow is not installed" in caplog.text
