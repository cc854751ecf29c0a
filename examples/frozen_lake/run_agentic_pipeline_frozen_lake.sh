#!/usr/bin/env bash
# Train the tiny local LM on 4x4 FrozenLake on CPU. Extra arguments are hydra overrides, e.g.
#   bash examples/frozen_lake/run_agentic_pipeline_frozen_lake.sh max_steps=50 seed=1
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL_DIR=./output/models/tiny-frozen-lake
python -m roll.pipeline.tiny_model --preset frozen_lake --output_dir "$MODEL_DIR"
python examples/start_agentic_pipeline.py --config_path frozen_lake --config_name agent_val_frozen_lake \
  pretrain="$MODEL_DIR" "$@"
python -m roll.tracking.plot ./output/frozen_lake_tiny  # writes ./output/frozen_lake_tiny/curves.png
