#!/usr/bin/env bash
# By-hand check (not CI): every ROLL example config in ../shared/roll_examples (or $1) runs one step
# with +profile=cpu_smoke, only pretrain, reward_pretrain and output paths overridden, and writes
# TensorBoard events under tracker_kwargs.log_dir. Needs a local model: $MODEL (built if missing).
# A second argument runs only the configs whose name matches that glob, e.g. '*lora*'.
set -u
ROOT=${1:-$(dirname "$0")/../../shared/roll_examples}
ONLY=${2:-*}
MODEL=${MODEL:-/tmp/roll_check_model}
OUT=${OUT:-/tmp/roll_check_out}
export PYTHONPATH=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
[ -f "$MODEL/config.json" ] || python -m roll.pipeline.tiny_model --preset sokoban --output_dir "$MODEL" >/dev/null
for f in "$ROOT"/*/*.yaml; do
  dir=$(dirname "$f"); name=$(basename "$f" .yaml); [ "$(basename "$dir")" = config ] && continue
  # shellcheck disable=SC2053  # $ONLY is a glob on purpose
  [[ $name == $ONLY ]] || continue
  o="$OUT/$name"; rm -rf "$o"
  python "$PYTHONPATH/examples/start_agentic_pipeline.py" --config_path "$dir" --config_name "$name" \
    +profile=cpu_smoke pretrain="$MODEL" reward_pretrain="$MODEL" max_steps=1 \
    ++tracker_kwargs.log_dir="$o/tb" ++checkpoint_config.output_dir="$o/ckpt" output_dir="$o/out" \
    logging_dir="$o/logs" render_save_dir="$o/render" >"$o.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && ls "$o"/tb/events.out.tfevents.* >/dev/null 2>&1; then echo "PASS $name"
  else echo "FAIL $name (exit $rc): $(grep -E '^(config error|training stopped)' "$o.log" | head -1)"; fi
done
