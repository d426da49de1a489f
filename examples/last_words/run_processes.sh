#!/usr/bin/env bash
# Seed 002 with ranks as processes: ckpt-run starts 4 of them, the --fail-rank one dies by
# SIGKILL, the survivors save the last words; --recover resumes from them in 4 new
# processes. Every rank must end with the parameters of a run without the failure, bit for bit.
#   run_processes.sh <last_words binary> <ckpt-run binary> <work dir> [extra options]
set -euo pipefail
program=$1
launcher=$2
work=$3
shift 3
export OPENBLAS_NUM_THREADS=1
rm -rf "$work"
mkdir -p "$work"
run() {  # run <store name> <options…>: the job's output; its status in $status
    local store=$1
    shift
    status=0
    "$launcher" --nproc 4 --store "file://$work/$store" -- "$program" "$@" > "$work/$store.log" 2>&1 || status=$?
    cat "$work/$store.log" >&2
}
hashes() {  # the distinct final_params_xxh64 values of a job's log, and how many ranks printed one
    local n
    n=$(grep -c 'final_params_xxh64=' "$1" || true)
    if [ "$n" -ne 4 ]; then echo "expected 4 ranks to finish, $n did" >&2; exit 1; fi
    grep -o 'final_params_xxh64=[0-9a-f]*' "$1" | sort -u
}
run failing --dir "$work/ttp_checkpoints" "$@"
if [ "$status" -ne 137 ]; then
    echo "expected ckpt-run to exit 137 (a worker killed by SIGKILL), got $status" >&2
    exit 1
fi
grep -q '^last words: global step' "$work/failing.log" || { echo "no last words were saved" >&2; exit 1; }
run recovered --dir "$work/ttp_checkpoints" --recover "$@"
[ "$status" -eq 0 ] || { echo "the recovery run failed with status $status" >&2; exit 1; }
recovered=$(hashes "$work/recovered.log")
run straight --dir "$work/no_fault" --no-fault "$@"
[ "$status" -eq 0 ] || { echo "the fault-free run failed with status $status" >&2; exit 1; }
straight=$(hashes "$work/straight.log")
if [ "$(echo "$recovered" | wc -l)" -ne 1 ] || [ "$recovered" != "$straight" ]; then
    echo "MISMATCH: recovered $recovered, fault-free $straight" >&2
    exit 1
fi
echo "every rank of the recovered and the fault-free runs ends bit-identical: $recovered"
