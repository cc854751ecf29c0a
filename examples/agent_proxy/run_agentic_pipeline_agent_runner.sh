#!/usr/bin/env bash
# Train the tiny local LM on FrozenLake through the chat proxy, played by an agent runner. Extra
# arguments are hydra overrides; --config_name picks the YAML (default: the GEMRunner one), e.g.
#   bash examples/agent_proxy/run_agentic_pipeline_agent_runner.sh --config_name agent_val_frozen_lake_byo
#   bash examples/agent_proxy/run_agentic_pipeline_agent_runner.sh max_steps=5
set -euo pipefail
cd "$(dirname "$0")/../.."
CONFIG=agent_val_frozen_lake_runner
if [[ ${1:-} == --config_name ]]; then CONFIG=$2; shift 2; fi
# a runner named by `examples.agent_proxy...` must import in the driver and in the Ray workers
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
MODEL_DIR=./output/models/tiny-frozen-lake
python -m roll.pipeline.tiny_model --preset frozen_lake --output_dir "$MODEL_DIR"
python examples/start_agentic_pipeline.py --config_path agent_proxy --config_name "$CONFIG" \
  pretrain="$MODEL_DIR" "$@"
