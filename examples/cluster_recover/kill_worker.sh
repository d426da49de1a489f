#!/usr/bin/env bash
# Seed 004: four workers under ckpt-run; one is killed with SIGKILL mid-run and ckpt-run
# starts it again; after the cooldown every worker rolls back to the newest step all ranks
# saved, and the job trains to the end. Every rank must end bit-identical to a run in which
# no worker died.
#   kill_worker.sh <cluster_recover> <ckpt-run> <work dir> [--rank R] [--at-step S] [options]
set -euo pipefail
program=$1
launcher=$2
work=$3
shift 3
rank=2
at_step=30
if [ "${1:-}" = "--rank" ]; then rank=$2; shift 2; fi
if [ "${1:-}" = "--at-step" ]; then at_step=$2; shift 2; fi
export OPENBLAS_NUM_THREADS=1
rm -rf "$work"
mkdir -p "$work"
source "$(dirname "$0")/common.sh"

"$launcher" --nproc 4 --store "file://$work/store" --max-restarts 1 -- \
    "$program" --dir "$work/checkpoints" "$@" > "$work/job.log" 2>&1 &
job=$!
wait_for_line "$work/job.log" "^step $at_step:" 120
pid=$(sed -n "s/^rank $rank: pid \([0-9]*\), start 1$/\1/p" "$work/job.log")
[ -n "$pid" ] || { echo "no pid for rank $rank" >&2; cat "$work/job.log" >&2; exit 1; }
echo "killing rank $rank (pid $pid) after global step $at_step"
kill -9 "$pid"
status=0
wait "$job" || status=$?
cat "$work/job.log"
[ "$status" -eq 0 ] || { echo "the job failed with status $status" >&2; exit 1; }
grep -q "^rank $rank: pid [0-9]*, start 2$" "$work/job.log" || { echo "rank $rank was not started again" >&2; exit 1; }
grep -q "every rank resumes at global step" "$work/job.log" || { echo "no rollback happened" >&2; exit 1; }
same_as_straight "$work/job.log" "$launcher" "$program" "$work" "$@"
