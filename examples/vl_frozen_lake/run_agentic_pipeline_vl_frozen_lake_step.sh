#!/usr/bin/env bash
# Train the tiny local Qwen2.5-VL on 4x4 FrozenLake frames step-wise (GiGPO, one sample per env
# step, the current frame alone in each prompt) on CPU. Extra arguments are hydra overrides, e.g.
#   bash examples/vl_frozen_lake/run_agentic_pipeline_vl_frozen_lake_step.sh max_steps=20 seed=1
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL_DIR=./output/models/tiny-vl-frozen-lake
OUTPUT_DIR=./output/vl_frozen_lake_step_tiny  # the config's output_dir, unless an override names another
for arg in "$@"; do [[ $arg == output_dir=* ]] && OUTPUT_DIR=${arg#output_dir=}; done
python -m roll.pipeline.tiny_model --preset vl_frozen_lake --output_dir "$MODEL_DIR"
python examples/start_agentic_pipeline.py --config_path vl_frozen_lake --config_name agentic_val_vl_frozen_lake_step \
  pretrain="$MODEL_DIR" "$@"
python -m roll.tracking.plot "$OUTPUT_DIR"  # writes $OUTPUT_DIR/curves.png
