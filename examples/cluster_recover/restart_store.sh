#!/usr/bin/env bash
# Seed 004 with the store on a redis-server: mid-run the server is killed with SIGKILL and
# started again, without persistence (every key lost: the workers register again) or with
# it (--persistent: an append-only file, fsynced on every write, brings the keys back);
# training goes on, and a worker killed afterwards is recovered as usual. Every rank must
# end bit-identical to a run in which nothing failed.
#   restart_store.sh <cluster_recover> <ckpt-run> <work dir> [--persistent] [options]
set -euo pipefail
program=$1
launcher=$2
work=$3
shift 3
persistent=no
if [ "${1:-}" = "--persistent" ]; then persistent=yes; shift; fi
export OPENBLAS_NUM_THREADS=1
rm -rf "$work"
mkdir -p "$work"
source "$(dirname "$0")/common.sh"

redis_pid=
trap 'kill -9 $redis_pid 2>/dev/null || true' EXIT
start_redis_on_free_port "$work" "$persistent" 1

"$launcher" --nproc 4 --store "redis://127.0.0.1:$port" --max-restarts 1 -- \
    "$program" --dir "$work/checkpoints" "$@" > "$work/job.log" 2>&1 &
job=$!
wait_for_line "$work/job.log" "^step 20:" 120
echo "killing the store (redis-server, pid $redis_pid) after global step 20, and starting it again (persistence: $persistent)"
kill -9 "$redis_pid"
wait "$redis_pid" 2>/dev/null || true
start_redis "$work" "$port" "$persistent" 2
wait_for_line "$work/job.log" "^step 40:" 120
pid=$(sed -n "s/^rank 1: pid \([0-9]*\), start 1$/\1/p" "$work/job.log")
echo "killing rank 1 (pid $pid) after global step 40"
kill -9 "$pid"
status=0
wait "$job" || status=$?
cat "$work/job.log"
[ "$status" -eq 0 ] || { echo "the job failed with status $status" >&2; exit 1; }
if [ "$persistent" = no ]; then
    grep -q "registered it again" "$work/job.log" || { echo "no worker registered again after the store restart" >&2; exit 1; }
elif grep -q "registered it again" "$work/job.log"; then
    echo "the store kept its keys, yet a worker found its node id lost" >&2
    exit 1
fi
grep -q "every rank resumes at global step" "$work/job.log" || { echo "no rollback happened" >&2; exit 1; }
memory_if_asked "$work/job.log" "$@"
same_as_straight "$work/job.log" "$launcher" "$program" "$work" "$@"
