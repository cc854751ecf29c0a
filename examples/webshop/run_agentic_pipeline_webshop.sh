#!/usr/bin/env bash
# Run the tiny local LM on WebShop (shipped synthetic catalog) on CPU. Builds the tiny model, warm-
# starts it by imitating a random shopper (the action format; a few minutes, once), then trains
# with RL. Extra arguments are hydra overrides, e.g.
#   bash examples/webshop/run_agentic_pipeline_webshop.sh max_steps=5 seed=1
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL_DIR=./output/models/tiny-webshop
WARM_DIR=./output/models/tiny-webshop-warm
python -m roll.pipeline.tiny_model --preset webshop --output_dir "$MODEL_DIR"
if [ ! -f "$WARM_DIR/warm_start.json" ]; then
  python -m roll.pipeline.warm_start --config_path webshop --config_name agent_val_webshop \
    --output_dir "$WARM_DIR" pretrain="$MODEL_DIR"
fi
python examples/start_agentic_pipeline.py --config_path webshop --config_name agent_val_webshop \
  pretrain="$WARM_DIR" "$@"
python -m roll.tracking.plot ./output/webshop_tiny  # writes ./output/webshop_tiny/curves.png
