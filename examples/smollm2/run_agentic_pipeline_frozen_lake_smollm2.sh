#!/usr/bin/env bash
# FrozenLake with SmolLM2-135M-Instruct on CPU (the realism check). Extra arguments are hydra
# overrides, e.g. to train with DeepSpeed ZeRO-3:
#   bash examples/smollm2/run_agentic_pipeline_frozen_lake_smollm2.sh \
#     actor_train.strategy_args.strategy_name=deepspeed_train \
#     +actor_train.strategy_args.strategy_config='{zero_optimization: {stage: 3}}'
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL_DIR=./output/models/smollm2-135m-instruct
if [ ! -f "$MODEL_DIR/config.json" ]; then
  pip install -q "gguf>=0.17" "accelerate>=1.0"  # transformers' GGUF reader needs both
  python -m roll.models.smollm2 --output_dir "$MODEL_DIR"
fi
python examples/start_agentic_pipeline.py --config_path smollm2 --config_name agent_val_frozen_lake_smollm2 \
  pretrain="$MODEL_DIR" "$@"
