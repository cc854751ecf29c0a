#!/usr/bin/env bash
# Train a local HF model on FrozenLake on one GPU (docs/tutorials/one_gpu.md). Arguments are hydra
# overrides; name your model's directory:
#   bash examples/real_model/run_agentic_pipeline_one_gpu.sh pretrain=/path/to/Qwen2.5-0.5B-Instruct
set -euo pipefail
cd "$(dirname "$0")/../.."
OUTPUT_DIR=./output/frozen_lake_one_gpu  # the config's output_dir, unless an override names another
for arg in "$@"; do [[ $arg == output_dir=* ]] && OUTPUT_DIR=${arg#output_dir=}; done
python examples/start_agentic_pipeline.py --config_path real_model --config_name agent_val_frozen_lake_one_gpu "$@"
python -m roll.tracking.plot "$OUTPUT_DIR"  # writes $OUTPUT_DIR/curves.png
