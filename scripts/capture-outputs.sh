#!/usr/bin/env bash
# Capture what a refactor must keep byte-identical: the SUBMIT=0 dry run, render, plan and the EDFs
# of every site x experiment x model (errors too), from the checkout it is run in. Usage:
#   scripts/capture-outputs.sh OUTDIR   (then, on another revision, capture to OUTDIR2 and diff -r OUTDIR OUTDIR2)
set -u
out="$(realpath -m "${1:?usage: scripts/capture-outputs.sh OUTDIR}")"; mkdir -p "$out"
cd "$(dirname "$0")/.."
# HOME: a fixed folder, so the dry run's EDF check reads the same (empty) ~/.edf on every revision
export PYTHONPATH="$PWD/src" ENVLAYERS_ROOT="$PWD" HOME="${CAPTURE_HOME:-/tmp/envlayers-capture-home}"
mkdir -p "$HOME"
catalog() { python3 -m envlayers list --json | python3 -c "import json, sys; print(*(x['name'] for x in json.load(sys.stdin)['$1']))"; }
models="$(catalog models)"; experiments="$(catalog experiments)"; sites="$(catalog sites)"
for site in $sites; do
  for exp in $experiments; do
    for m in $models; do
      tag="$site-$exp-$m"
      SITE=$site EXPERIMENT=$exp MODEL=$m SUBMIT=0 SCRATCH=/scratch cluster/serve-only.sbatch >"$out/$tag.dry" 2>&1; echo "rc=$?" >>"$out/$tag.dry"
      SITE=$site python3 -m envlayers render "$exp:$m" >"$out/$tag.render" 2>&1; echo "rc=$?" >>"$out/$tag.render"
      SITE=$site python3 -m envlayers plan --model "$m" --experiment "$exp" >"$out/$tag.plan" 2>&1; echo "rc=$?" >>"$out/$tag.plan"
    done
  done
done
for site in $sites; do
  SITE=$site python3 -m envlayers edf list >"$out/$site.edf-list" 2>&1; echo "rc=$?" >>"$out/$site.edf-list"
  for role in $(ls containers/edfs/ | sed 's/\.yaml$//'); do
    SITE=$site python3 -m envlayers edf show "$role" >"$out/$site-$role.edf" 2>&1; echo "rc=$?" >>"$out/$site-$role.edf"
  done
done
