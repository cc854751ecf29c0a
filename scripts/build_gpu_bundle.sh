#!/usr/bin/env bash
# Fills .gpu_bundle/ (git-ignored) with what the pipeline needs on a lent GPU machine that has
# PyTorch+CUDA, transformers and peft but no network, no Ray, hydra, pydantic or gymnasium:
#   ray-core.tar.xz   Ray's cp312 wheel unpacked without its Java jars, dashboard web client and the
#                     libraries roll never imports (rllib, serve, data, llm), xz-compressed:
#                     about 28 MB where the wheel is 79 MB, so one call carries it with the checkout
#   wheels/           cp312 wheels of the other needs (hydra-core, omegaconf, antlr4, pydantic,
#                     tensordict, gymnasium, bm25s, jsonschema, the proxy's starlette, uvicorn and
#                     openai, ...), py-spy (the lane's --spy) and roll's own wheel,
#                     which installs the `roll.envs` entry point there (no build step on that machine)
# Versions are the ones installed here, so the GPU run uses what CI tests. Every file is under 60 MB.
# On the machine, scripts/install_gpu_bundle.sh installs it offline into a folder for PYTHONPATH.
#   usage: scripts/build_gpu_bundle.sh [BUNDLE] [PYTHON_VERSION]
set -euo pipefail
cd "$(dirname "$0")/.."
BUNDLE="${1:-.gpu_bundle}"
PYVER="${2:-3.12}"
rm -rf "$BUNDLE" && mkdir -p "$BUNDLE/wheels"
version() { python -c "import importlib.metadata as m; print(m.version('$1'))"; }
pins() { for name in "$@"; do echo "$name==$(version "$name")"; done; }
platforms=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014; do
  platforms+=(--platform "${tag}_x86_64")
done
download() {
  python -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    "${platforms[@]}" -d "$1" "${@:2}"
}
binary=(hydra-core omegaconf pydantic pydantic-core annotated-types typing-inspection tensordict pyvers
        gymnasium farama-notifications bm25s jsonschema jsonschema-specifications referencing rpds-py
        starlette uvicorn httptools openai jiter sniffio httpx2 httpcore2 truststore h11 anyio)
download "$BUNDLE/wheels" $(pins "${binary[@]}")
download "$BUNDLE/wheels" py-spy==0.4.3  # the lane's --spy (benchmarks/reliability/spy.py); a static binary, Python-independent
python -m pip wheel -q --no-deps --no-build-isolation -w "$BUNDLE/wheels" "$(pins antlr4-python3-runtime)" .

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
download "$work" "$(pins ray)"
mkdir "$work/tree"
(cd "$work/tree" && unzip -q "$work"/ray-*.whl \
  && rm -rf ray/jars ray/dashboard/client/build ray/rllib ray/serve ray/data ray/llm \
  && find . -name __pycache__ -prune -exec rm -rf {} + \
  && tar -cJf "$OLDPWD/$BUNDLE/ray-core.tar.xz" .)
du -sh "$BUNDLE"/* "$BUNDLE"/wheels | sed 's/^/  /'
echo "$BUNDLE: $(du -sh "$BUNDLE" | cut -f1) for Python $PYVER"
