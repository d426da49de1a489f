#!/usr/bin/env bash
# Seed 002 end to end: a rank fails, the survivors save the last words, --recover resumes
# from them; the result must equal a run without the failure, bit for bit.
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
recovered=$("$program" --dir "$work/ttp_checkpoints" --recover "$@" | tee /dev/stderr | grep '^final_params_xxh64=')
straight=$("$program" --dir "$work/no_fault" --no-fault "$@" | grep '^final_params_xxh64=')
if [ "$recovered" != "$straight" ]; then
    echo "MISMATCH: recovered $recovered, fault-free $straight" >&2
    exit 1
fi
echo "recovered and fault-free runs end bit-identical: $recovered"
