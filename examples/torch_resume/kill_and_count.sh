#!/usr/bin/env bash
# torch_resume killed with SIGKILL at random moments and run again with the same command each
# time (examples/fault_recover/kill_many_times.sh, which also checks that the job ends with the
# parameters of a run that was never killed); then its checkpoint directory must hold no more
# than its retention keeps, whatever the number of runs: KeepLast{2} and KeepBest{3} make at
# most 5 checkpoints, and a run's graph.meta stays only while the run has a checkpoint.
#   kill_and_count.sh <torch_resume> <work dir> [kills, default 12]
set -euo pipefail
program=$1
work=$2
kills=${3:-12}
here=$(cd "$(dirname "$0")" && pwd)
bound=5  # KeepLast{2} + KeepBest{3}, as main.cpp sets them

fail() {
    echo "FAIL: $*" >&2
    exit 1
}

bash "$here/../fault_recover/kill_many_times.sh" "$program" "$work" "$kills"

dir=$work/ckpt
runs=$(ls "$work"/run-*.log | wc -l)
shopt -s nullglob
checkpoints=("$dir"/*.ckpt)
metas=("$dir"/*-graph.meta)
echo "after $runs runs: ${#checkpoints[@]} checkpoints and ${#metas[@]} graph.meta files in $dir:"
ls "$dir"
[ "${#checkpoints[@]}" -le "$bound" ] ||
    fail "${#checkpoints[@]} checkpoints after $runs runs: retention (KeepLast{2}, KeepBest{3}) keeps at most $bound"
declare -A has_checkpoint=()
for f in "${checkpoints[@]}"; do
    name=${f##*/}
    has_checkpoint[${name%-*}]=1
done
for f in "${metas[@]}"; do
    name=${f##*/}
    run=${name%-graph.meta}
    [ -n "${has_checkpoint[$run]:-}" ] || fail "$name stays, but run '$run' has no checkpoint left"
done
echo "OK: at most $bound checkpoints, and a graph.meta only for runs that have one, after $runs runs"
