#!/usr/bin/env bash
# Fills a folder (default .gpu_site, git-ignored) with the Python packages the GPU lane (.ci/run_gpu)
# imports and a lent GPU machine lacks, for that machine's Python (default 3.12, x86-64 Linux):
# hydra-core, omegaconf, antlr4, pydantic (+ pydantic-core, a compiled wheel), tensordict,
# megatron-core (compiled), deepspeed (built here without its CUDA ops) and their small needs.
# Versions are the ones installed here, so the GPU lane runs what CI tests. The folder travels with
# the checkout (`carry: [".gpu_site"]`, about 36 MB); .ci/run_gpu puts it on PYTHONPATH.
#   usage: scripts/build_gpu_site.sh [SITE] [PYTHON_VERSION]
set -euo pipefail
cd "$(dirname "$0")/.."
SITE="${1:-.gpu_site}"
PYVER="${2:-3.12}"
version() { python -c "import importlib.metadata as m; print(m.version('$1'))"; }
binary=(tensordict pyvers hydra-core omegaconf pydantic pydantic-core annotated-types typing-inspection
        megatron-core hjson typing-extensions)
from_source=(antlr4-python3-runtime deepspeed)  # published as source only
wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
pins() { for name in "$@"; do echo "$name==$(version "$name")"; done; }
platforms=()
for tag in manylinux_2_35 manylinux_2_34 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014; do
  platforms+=(--platform "${tag}_x86_64")
done
python -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  "${platforms[@]}" -d "$wheels" $(pins "${binary[@]}")
DS_BUILD_OPS=0 python -m pip wheel -q --no-deps --no-build-isolation -w "$wheels" $(pins "${from_source[@]}")
python -m pip install -q --no-deps --no-compile --only-binary=:all: --python-version "$PYVER" --implementation cp \
  "${platforms[@]}" --target "$SITE" --upgrade "$wheels"/*.whl
echo "$SITE: $(du -sh "$SITE" | cut -f1) for Python $PYVER ($(ls "$wheels" | wc -l) wheels)"
