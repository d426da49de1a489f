#!/usr/bin/env bash
# Seed 003 end to end: a UCE repaired in place must end bit-identical to a run without it.
#   run.sh <uce_recover binary> [options, e.g. --fail-rank 0 --fail-step 7 --limit 2560]
set -euo pipefail
program=$1
shift
export OPENBLAS_NUM_THREADS=1
repaired=$("$program" "$@" | tee /dev/stderr | grep '^final_params_xxh64=')
straight=$("$program" --no-fault "$@" | grep '^final_params_xxh64=')
if [ "$repaired" != "$straight" ]; then
    echo "MISMATCH: repaired $repaired, without the UCE $straight" >&2
    exit 1
fi
echo "repaired and clean runs end bit-identical: $repaired"
