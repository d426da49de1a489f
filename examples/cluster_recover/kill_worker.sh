#!/usr/bin/env bash
# Seed 004: four workers under ckpt-run; one is killed with SIGKILL mid-run and ckpt-run
# starts it again; after the cooldown every worker rolls back to the newest step all ranks
# saved (in files, or with --memory-every in memory), and the job trains to the end. Every
# rank must end bit-identical to a run in which no worker died.
#   kill_worker.sh <cluster_recover> <ckpt-run> <work dir> [--rank R[,R…]] [--at-step S]
#                  [--expect memory|files|index] [options]
# --rank: the workers killed together (default 2); --expect: where the rollback must come
# from (memory: no more than K steps redone for --memory-every K, none with --last-words;
# index: the global index, as with --replica-parallel).
set -euo pipefail
program=$1
launcher=$2
work=$3
shift 3
ranks=2
at_step=30
if [ "${1:-}" = "--rank" ]; then ranks=$2; shift 2; fi
if [ "${1:-}" = "--at-step" ]; then at_step=$2; shift 2; fi
expect=
if [ "${1:-}" = "--expect" ]; then expect=$2; shift 2; fi
export OPENBLAS_NUM_THREADS=1
rm -rf "$work"
mkdir -p "$work"
source "$(dirname "$0")/common.sh"

"$launcher" --nproc 4 --store "file://$work/store" --max-restarts 1 -- \
    "$program" --dir "$work/checkpoints" "$@" > "$work/job.log" 2>&1 &
job=$!
wait_for_line "$work/job.log" "^step $at_step:" 120
pids=()
for rank in ${ranks//,/ }; do
    pid=$(sed -n "s/^rank $rank: pid \([0-9]*\), start 1$/\1/p" "$work/job.log")
    [ -n "$pid" ] || { echo "no pid for rank $rank" >&2; cat "$work/job.log" >&2; exit 1; }
    pids+=("$pid")
done
echo "killing rank(s) $ranks (pid(s) ${pids[*]}) after global step $at_step"
kill -9 "${pids[@]}"
status=0
wait "$job" || status=$?
cat "$work/job.log"
[ "$status" -eq 0 ] || { echo "the job failed with status $status" >&2; exit 1; }
for rank in ${ranks//,/ }; do
    grep -q "^rank $rank: pid [0-9]*, start 2$" "$work/job.log" || { echo "rank $rank was not started again" >&2; exit 1; }
done
grep -q "every rank resumes at global step" "$work/job.log" || { echo "no rollback happened" >&2; exit 1; }
case "$expect" in
    memory)
        grep -q "every rank resumes at global step [0-9]* (.*) from memory" "$work/job.log" ||
            { echo "the rollback did not come from memory" >&2; exit 1; }
        for rank in ${ranks//,/ }; do
            grep -q "^rank $rank: state of global step [0-9]* from rank [0-9]*'s \(memory\|last words\)" "$work/job.log" ||
                { echo "rank $rank did not get its state from another rank's memory" >&2; exit 1; }
        done
        # steps redone: from the last step completed before the kill to the one resumed at
        every=$(memory_every "$@")
        done_before=$(sed -n "s/^rank [0-9]*: after global step \([0-9]*\):.*/\1/p" "$work/job.log" | sort -n | tail -1)
        resumed=$(sed -n 's/.*every rank resumes at global step \([0-9]*\) .*/\1/p' "$work/job.log" | tail -1)
        redone=$((done_before - resumed + 1))
        echo "steps redone: $redone (the survivors had completed $done_before, training resumed at $resumed; K = $every)"
        [ "$redone" -le "$every" ] || { echo "more than K = $every steps redone" >&2; exit 1; }
        case " $* " in
            *" --last-words "*) [ "$redone" -eq 0 ] || { echo "steps redone despite the last words" >&2; exit 1; } ;;
        esac ;;
    files)
        grep -q "every rank resumes at global step [0-9]* (.*) from its checkpoint" "$work/job.log" ||
            { echo "the rollback did not come from the files" >&2; exit 1; } ;;
    index)
        grep -q "every rank resumes at global step [0-9]* (.*) from the global index of step [0-9]*, saved by 4 rank" \
            "$work/job.log" || { echo "the rollback did not come from a global index of the 4 ranks" >&2; exit 1; } ;;
esac
same_as_straight "$work/job.log" "$launcher" "$program" "$work" "$@"
