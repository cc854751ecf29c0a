"""Rollout traces: every trajectory of a step as one JSON line, to read what the policy did.

Metrics say that the reward went up; a trace says how: the decoded turns, the tool calls the model
wrote, where an episode stopped and why, which weights generated it. `RolloutTracer.write` puts a
step's trajectories in `output_dir/traces/step_N.jsonl` (`val_step_N.jsonl` for a validation; one
file per step, so a resumed run simply rewrites the steps it plays again), the first
`samples_to_tensorboard` of them as TensorBoard text, and, when asked and installed, the file as
an mlflow artifact (mlflow is optional and never a requirement).

Texts are decoded from the exact token ids the trainer sees (special tokens kept), not re-rendered
from messages, so a trace shows the sample as trained on.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from roll.agentic.agent_loop.tools import parse_tool_calls
from roll.core.records import Trajectory
from roll.utils.atomic import write_atomic

log = logging.getLogger(__name__)


def _segments(token_ids: list[int], mask: list[int]) -> list[tuple[int, list[int]]]:
    """Runs of equal mask value: [(mask, ids), ...] in order."""
    runs: list[tuple[int, list[int]]] = []
    for tok, m in zip(token_ids, mask):
        if runs and runs[-1][0] == m:
            runs[-1][1].append(tok)
        else:
            runs.append((m, [tok]))
    return runs


def trace_record(tr: Trajectory, tokenizer, step: int) -> dict[str, Any]:
    """One trajectory as a JSON-able dict: ids, outcome, timing, and its text turn by turn
    ("context": prompt and observations, mask 0; "policy": generated, mask 1)."""

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False)

    if tr.steps:  # step-wise: one (prompt, response) pair per env step
        turns: list[dict[str, Any]] = [
            {"prompt": decode(s.prompt_ids), "response": decode(s.response_ids), "reward": s.reward} for s in tr.steps
        ]
    else:
        turns = [
            {"role": "policy" if m else "context", "text": decode(ids), "num_tokens": len(ids)}
            for m, ids in _segments(tr.token_ids, tr.response_mask)
        ]
    generated = [t.get("response", t.get("text", "")) for t in turns if t.get("role", "policy") == "policy"]
    tool_calls = [
        {"name": c.name, "arguments": c.arguments, "error": c.error}
        for text in generated
        for c in parse_tool_calls(text)
    ]
    return {
        "step": step,
        "tag": tr.tag,
        "traj_group_id": tr.traj_group_id,
        "traj_id": tr.traj_id,
        "env_seed": tr.env_seed,
        "policy_version": tr.policy_version,
        "policy_versions": tr.policy_versions,
        "stop_reason": tr.stop_reason,
        "success": tr.success,
        "episode_reward": tr.episode_reward,
        "step_rewards": tr.step_rewards,
        "num_actions": tr.num_actions,
        "num_valid_actions": tr.num_valid_actions,
        "num_tokens": tr.num_tokens,
        "num_generated_tokens": tr.num_generated_tokens,
        "rollout_s": round(tr.rollout_s, 4),
        "metrics": tr.metrics,
        "tool_calls": tool_calls,
        "turns": turns,
    }


def as_markdown(record: dict[str, Any]) -> str:
    """A trace record as TensorBoard text (markdown): a header line, then each turn."""
    head = (
        f"**{record['traj_id']}** ({record['tag']}, seed {record['env_seed']}): reward "
        f"{record['episode_reward']:g}, {record['stop_reason']}, policy v{record['policy_version']}, "
        f"{record['num_generated_tokens']}/{record['num_tokens']} tokens generated, {record['rollout_s']:.2f}s"
    )
    body = []
    for t in record["turns"]:
        if "role" in t:
            body.append(f"*{t['role']}*:\n\n    " + t["text"].replace("\n", "\n    "))
        else:
            body.append(
                f"*prompt*:\n\n    {t['prompt']}\n\n*response* (reward {t['reward']:g}):\n\n    {t['response']}"
            )
    return "\n\n".join([head, *body])


class RolloutTracer:
    """Writes the traces of a run (see the module docstring). `tracker` is the run's `Tracker`
    (for TensorBoard text); `mlflow`: log each trace file as an artifact when mlflow imports."""

    def __init__(
        self,
        output_dir: str | os.PathLike[str],
        tokenizer,
        tracker=None,
        samples_to_tensorboard: int = 0,
        mlflow: bool = False,
    ):
        self.directory = Path(output_dir) / "traces"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.tokenizer = tokenizer
        self.tracker = tracker
        self.samples_to_tensorboard = samples_to_tensorboard
        self._mlflow = _import_mlflow() if mlflow else None

    def write(self, step: int, trajs: list[Trajectory], prefix: str = "train") -> Path:
        """Trace file of one step's trajectories (in the order given); returns its path."""
        records = [trace_record(tr, self.tokenizer, step) for tr in trajs]
        path = self.directory / (f"step_{step}.jsonl" if prefix == "train" else f"{prefix}_step_{step}.jsonl")
        write_atomic(path, "".join(json.dumps(r, default=str) + "\n" for r in records))  # never half a trace
        if self.tracker is not None:
            for i, record in enumerate(records[: self.samples_to_tensorboard]):
                self.tracker.log_text(step, f"traces/{prefix}/{i}", as_markdown(record))
        if self._mlflow is not None:
            try:
                self._mlflow.log_artifact(str(path), artifact_path="traces")
            except Exception as e:  # a tracking server hiccup must not stop training
                log.warning("mlflow: could not log %s: %s", path, e)
        return path


def _import_mlflow():
    try:
        import mlflow
    except ImportError:
        log.warning("trace_to_mlflow: mlflow is not installed (pip install mlflow); traces go to files only")
        return None
    return mlflow
