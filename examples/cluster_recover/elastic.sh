#!/usr/bin/env bash
# Elastic training with real processes: 4 workers under `ckpt-run --elastic` train with
# momentum whose state is sharded over all ranks. Rank 0 is killed with SIGKILL and, with no
# restarts left, not started again: the 3 others form a smaller generation after
# --elastic-wait-ms and go on from the newest global index, each loading its pieces for its
# new place. Then a new worker 0 is started on its own (another host's launcher): the others
# take it in at their next checkpoint and all 4 go on from that checkpoint with no step
# redone. With --redis, the store is a redis-server, killed and started empty while the 3
# train. Every rank must end with the same parameters.
#   elastic.sh <cluster_recover> <ckpt-run> <work dir> [--redis] [options]
set -euo pipefail
program=$1
launcher=$2
work=$3
shift 3
redis=no
if [ "${1:-}" = "--redis" ]; then redis=yes; shift; fi
export OPENBLAS_NUM_THREADS=1
rm -rf "$work"
mkdir -p "$work"
source "$(dirname "$0")/common.sh"

redis_pid=
trap 'kill -9 $redis_pid 2>/dev/null || true' EXIT
if [ "$redis" = yes ]; then
    start_redis_on_free_port "$work" no 1
    store="redis://127.0.0.1:$port"
else
    store="file://$work/store"
fi
options=(--dir "$work/checkpoints" --elastic --elastic-wait-ms 2000 --cooldown-ms 500 --timeout-ms 10000 "$@")

"$launcher" --elastic --nproc 4 --store "$store" -- "$program" "${options[@]}" > "$work/job.log" 2>&1 &
job=$!
wait_for_line "$work/job.log" "^step 10:" 120
pid=$(sed -n "s/^rank 0: pid \([0-9]*\), start 1$/\1/p" "$work/job.log")
echo "killing rank 0 (pid $pid) after global step 10; it is not started again"
kill -9 "$pid"
wait_for_line "$work/job.log" "^generation [0-9]*: 3 rank(s), workers 1, 2, 3" 60
if [ "$redis" = yes ]; then
    echo "killing the store (redis-server, pid $redis_pid) and starting it again empty"
    kill -9 "$redis_pid"
    wait "$redis_pid" 2>/dev/null || true
    start_redis "$work" "$port" no 2
    # the survivors set their keys again (their node ids, the latest generation) within a beat
    for r in 1 2 3; do wait_for_line "$work/job.log" "lost node id $r; registered it again" 30; done
fi
echo "starting a new worker 0"
"$launcher" --nproc 1 --first-rank 0 --world-size 4 --store "$store" -- "$program" "${options[@]}" \
    > "$work/joiner.log" 2>&1 &
joiner=$!
status=0
wait "$job" || status=$?
joiner_status=0
wait "$joiner" || joiner_status=$?
cat "$work/job.log"
echo "--- the new worker 0:"
cat "$work/joiner.log"
[ "$status" -eq 0 ] || { echo "the job failed with status $status" >&2; exit 1; }
[ "$joiner_status" -eq 0 ] || { echo "the new worker 0 failed with status $joiner_status" >&2; exit 1; }
grep -q "no restarts left: the job goes on without it" "$work/job.log" ||
    { echo "ckpt-run did not leave rank 0 out" >&2; exit 1; }
# the 3 went on from an index saved by 4 ranks, at most --save-every steps back
shrunk=$(grep -m1 "resumes at global step [0-9]* .*from the global index of step [0-9]*, saved by 4 rank" "$work/job.log") ||
    { echo "the 3 survivors did not resume from the 4 ranks' global index" >&2; exit 1; }
echo "$shrunk"
# all 4 went on from an index the 3 saved, the step after it: no step redone
grown=$(grep -m1 "generation [0-9]*: every rank resumes at global step [0-9]* .*from the global index of step [0-9]*, saved by 3 rank" \
    "$work/joiner.log") || { echo "the new worker 0 was not taken in from the 3 ranks' global index" >&2; exit 1; }
echo "$grown"
taken_at=$(grep -m1 -o "after global step [0-9]*, worker(s) 0 wait to join" "$work/job.log" | grep -o "[0-9]*" | head -1)
[ -n "$taken_at" ] || { echo "no rank took the new worker in at a checkpoint" >&2; exit 1; }
echo "$grown" | grep -q "resumes at global step $((taken_at + 1)) .*global index of step $taken_at," ||
    { echo "the generation of 4 did not resume right after step $taken_at, where it was formed" >&2; exit 1; }
cat "$work/job.log" "$work/joiner.log" > "$work/all.log"
echo "every rank ends with the same parameters: $(final_hashes "$work/all.log")"
if [ "$redis" = yes ]; then
    grep -q "registered it again" "$work/all.log" || { echo "no worker registered again after the store restart" >&2; exit 1; }
fi
