#!/usr/bin/env bash
# Train the tiny local LM as a calculator-using math agent on CPU. Needs math-verify:
#   pip install -e ".[math]"
# Extra arguments are hydra overrides, e.g.
#   bash examples/math_agent/run_agentic_pipeline_math.sh max_steps=10 seed=1
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL_DIR=./output/models/tiny-math
python -m roll.pipeline.tiny_model --preset math --output_dir "$MODEL_DIR"
python examples/start_agentic_pipeline.py --config_path math_agent --config_name agent_val_math \
  pretrain="$MODEL_DIR" "$@"
