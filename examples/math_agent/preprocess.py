"""MATH-format rows (`problem`, `solution`, `level`, `type`; MATH-lighteval, our sample set) ->
rows the agent pipeline plays (`custom_envs.<Tag>.env_type: agent`): `prompt`, `answer` (the last
`\\boxed{...}` of the solution), `level`, `type`, `agent_name`, `agent_cfg_path`.

`agent_cfg_path` is written relative to the output file's directory (the pipeline resolves it
against the dataset's directory), so the output and the agent config can move together.
Rows whose solution has no `\\boxed{}` are skipped (and counted).

    python examples/math_agent/preprocess.py examples/math_agent/data/train.jsonl \\
        --output examples/math_agent/data/train_agent.jsonl
    python examples/math_agent/preprocess.py MATH-lighteval/train.parquet --output math_train.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from roll.agentic.agent_loop.dataset import read_rows
from roll.agentic.agent_loop.math_reward import last_boxed

HERE = os.path.dirname(os.path.abspath(__file__))
INSTRUCTION = "Put the final answer in \\boxed{}."


def to_agent_row(row: dict, agent_name: str, agent_cfg_path: str) -> dict | None:
    """One training row, or None when the solution has no boxed answer."""
    answer = last_boxed(str(row.get("solution", "")))
    if answer is None:
        return None
    return {
        "prompt": f"{row['problem']}\n{INSTRUCTION}",
        "answer": answer.strip(),
        "level": row.get("level", ""),
        "type": row.get("type", ""),
        "agent_name": agent_name,
        "agent_cfg_path": agent_cfg_path,
    }


def preprocess(src: str, output: str, agent_name: str, agent_cfg: str) -> tuple[int, int]:
    """Write the agent rows of `src` to `output` (JSONL); return (written, skipped)."""
    rel_cfg = os.path.relpath(os.path.abspath(agent_cfg), os.path.dirname(os.path.abspath(output)))
    rows = [to_agent_row(r, agent_name, rel_cfg) for r in read_rows(src)]
    kept = [r for r in rows if r is not None]
    with open(output, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in kept)
    return len(kept), len(rows) - len(kept)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="MATH-format .jsonl or .parquet")
    parser.add_argument("--output", help="default: SOURCE with _agent.jsonl")
    parser.add_argument("--agent_name", default="tool_agent")
    parser.add_argument("--agent_cfg", default=os.path.join(HERE, "tool_agent.yaml"))
    args = parser.parse_args(argv)
    output = args.output or os.path.splitext(args.source)[0] + "_agent.jsonl"
    if not os.path.isfile(args.source):
        sys.exit(f"preprocess: {args.source!r} does not exist")
    written, skipped = preprocess(args.source, output, args.agent_name, args.agent_cfg)
    print(f"{output}: {written} rows ({skipped} without a boxed answer skipped)")


if __name__ == "__main__":
    main()
