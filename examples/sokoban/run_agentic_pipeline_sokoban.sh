#!/usr/bin/env bash
# Train the tiny local LM on 6x6 one-box Sokoban on CPU. Extra arguments are hydra overrides, e.g.
#   bash examples/sokoban/run_agentic_pipeline_sokoban.sh max_steps=50 seed=1
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL_DIR=./output/models/tiny-sokoban
python -m roll.pipeline.tiny_model --preset sokoban --output_dir "$MODEL_DIR"
python examples/start_agentic_pipeline.py --config_path sokoban --config_name agent_val_sokoban \
  pretrain="$MODEL_DIR" "$@"
python -m roll.tracking.plot ./output/sokoban_tiny  # writes ./output/sokoban_tiny/curves.png
