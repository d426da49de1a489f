#!/usr/bin/env bash
# Seed 002 end to end: a rank fails, the survivors save the last words, the same command run
# again resumes from them; the result must equal a run without the failure, bit for bit.
#   run.sh <last_words binary> <work dir> [extra options, e.g. --small]
set -euo pipefail
program=$1
work=$2
shift 2
export OPENBLAS_NUM_THREADS=1
rm -rf "$work"
mkdir -p "$work"
status=0
"$program" --dir "$work/ttp_checkpoints" "$@" || status=$?
if [ "$status" -ne 3 ]; then
    echo "expected exit status 3 (a rank failed, last words saved), got $status" >&2
    exit 1
fi
# the same command again: it resumes from the last words
"$program" --dir "$work/ttp_checkpoints" "$@" > "$work/rerun.log"
cat "$work/rerun.log" >&2
grep -q '^resuming from ' "$work/rerun.log" || { echo "the second run did not resume from the last words" >&2; exit 1; }
recovered=$(grep '^final_params_xxh64=' "$work/rerun.log")
straight=$("$program" --dir "$work/no_fault" --no-fault "$@" | grep '^final_params_xxh64=')
if [ "$recovered" != "$straight" ]; then
    echo "MISMATCH: recovered $recovered, fault-free $straight" >&2
    exit 1
fi
echo "recovered and fault-free runs end bit-identical: $recovered"
