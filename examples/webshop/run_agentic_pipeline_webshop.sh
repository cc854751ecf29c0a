#!/usr/bin/env bash
# Run the tiny local LM on WebShop (shipped synthetic catalog) on CPU for a few steps. Extra
# arguments are hydra overrides, e.g.
#   bash examples/webshop/run_agentic_pipeline_webshop.sh max_steps=5 seed=1
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL_DIR=./output/models/tiny-webshop
python -m roll.pipeline.tiny_model --preset webshop --output_dir "$MODEL_DIR"
python examples/start_agentic_pipeline.py --config_path webshop --config_name agent_val_webshop \
  pretrain="$MODEL_DIR" "$@"
python -m roll.tracking.plot ./output/webshop_tiny  # writes ./output/webshop_tiny/curves.png
