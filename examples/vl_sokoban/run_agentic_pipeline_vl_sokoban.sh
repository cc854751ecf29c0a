#!/usr/bin/env bash
# Train the tiny local Qwen2.5-VL on 6x6 one-box Sokoban frames on CPU. Extra arguments are hydra
# overrides, e.g.
#   bash examples/vl_sokoban/run_agentic_pipeline_vl_sokoban.sh max_steps=20 seed=1
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL_DIR=./output/models/tiny-vl-sokoban
python -m roll.pipeline.tiny_model --preset vl_sokoban --output_dir "$MODEL_DIR"
python examples/start_agentic_pipeline.py --config_path vl_sokoban --config_name agentic_val_vl_sokoban \
  pretrain="$MODEL_DIR" "$@"
