#!/usr/bin/env bash
# Train the tiny local LM on the custom GuessNumber env on CPU. Extra arguments are hydra
# overrides, e.g.  bash examples/custom_env/run_agentic_pipeline_guess_number.sh max_steps=20
set -euo pipefail
cd "$(dirname "$0")/../.."
# `env_type: examples.custom_env.guess_number:GuessNumberEnv` must be importable by the driver
# and by the Ray workers (which inherit the environment): put the repository on PYTHONPATH.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
MODEL_DIR=./output/models/tiny-guess-number
python -m roll.pipeline.tiny_model --env_type examples.custom_env.guess_number:GuessNumberEnv \
  --output_dir "$MODEL_DIR"
python examples/start_agentic_pipeline.py --config_path custom_env --config_name agent_val_guess_number \
  pretrain="$MODEL_DIR" "$@"
