#!/usr/bin/env bash
# Install GEM (gem-llm 0.0.4, the version ROLL pins) for the `game:` / `rg:` env ids (envs/gem_envs).
# gem-llm is installed without its declared dependencies: it asks for math-verify[antlr4_13_2],
# whose antlr4 runtime 4.13 breaks hydra-core (pinned to antlr4 4.9), and math-verify is used only
# by GEM's hub-dataset math envs, which roll refuses. What the game and reasoning-gym envs import
# is pyproject.toml's "gem" extra (reasoning-gym, nltk), installed here at the same pins (`pip install
# -e ".[gem]"` would do it too, but would also re-point an existing editable install).
set -euo pipefail
cd "$(dirname "$0")/.."
pip install -q "reasoning-gym==0.1.23" "nltk==3.9.1"
pip install -q --no-deps "gem-llm==0.0.4"
python -c "import gem.envs" >/dev/null
