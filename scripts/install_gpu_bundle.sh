#!/usr/bin/env bash
# Installs .gpu_bundle/ (made here by scripts/build_gpu_bundle.sh, carried with the checkout) on a
# lent GPU machine without network: Ray unpacked and every wheel installed, offline and without
# dependency resolution, into SITE (default /tmp/site). Then: export PYTHONPATH="$PWD:SITE".
#   usage: scripts/install_gpu_bundle.sh [SITE]
set -euo pipefail
cd "$(dirname "$0")/.."
BUNDLE="${ROLL_GPU_BUNDLE:-.gpu_bundle}"
SITE="${1:-/tmp/site}"
mkdir -p "$SITE"
"${PYTHON:-python3}" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="tar")' \
  "$BUNDLE/ray-core.tar.xz" "$SITE"  # Python's lzma: no xz binary needed there
"${PYTHON:-python3}" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$SITE" "$BUNDLE"/wheels/*.whl
echo "installed into $SITE: $(ls "$SITE" | grep -c dist-info) packages"
