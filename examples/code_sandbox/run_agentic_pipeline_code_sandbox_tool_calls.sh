#!/usr/bin/env bash
# Train the tiny local LM on the sandboxed coding env through the chat proxy's tool-call runner
# (OpenAI `tool_calls` run in the episode sandboxes) on CPU. Extra arguments are hydra overrides, e.g.
#   bash examples/code_sandbox/run_agentic_pipeline_code_sandbox_tool_calls.sh max_steps=2 +profile=cpu_smoke
set -euo pipefail
cd "$(dirname "$0")/../.."
# the runner and the env are imported in the driver and in the Ray env workers
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
MODEL_DIR=./output/models/tiny-code-sandbox
python -m roll.pipeline.tiny_model --env_type code_sandbox --output_dir "$MODEL_DIR"
python examples/start_agentic_pipeline.py --config_path code_sandbox \
  --config_name agent_val_code_sandbox_tool_calls pretrain="$MODEL_DIR" "$@"
