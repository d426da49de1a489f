#!/usr/bin/env bash
# Every worker killed in turn: four workers under ckpt-run with the memory level on; rank 0 is
# killed with SIGKILL after global step 20, rank 1 after 40, rank 2 after 60, rank 3 after 80,
# each started again by ckpt-run. Every recovery must take the state from memory (the killed
# rank's from its partner's) and redo no more than K steps, and every rank must end
# bit-identical to a run in which no worker died.
#   kill_each.sh <cluster_recover> <ckpt-run> <work dir> --memory-every K [options]
set -euo pipefail
program=$1
launcher=$2
work=$3
shift 3
export OPENBLAS_NUM_THREADS=1
rm -rf "$work"
mkdir -p "$work"
source "$(dirname "$0")/common.sh"
every=$(memory_every "$@")
[ -n "$every" ] || { echo "kill_each.sh needs --memory-every K" >&2; exit 2; }

"$launcher" --nproc 4 --store "file://$work/store" --max-restarts 1 -- \
    "$program" --dir "$work/checkpoints" --epochs 3 "$@" > "$work/job.log" 2>&1 &
job=$!
for rank in 0 1 2 3; do
    at=$((20 * (rank + 1)))
    wait_for_line "$work/job.log" "^step $at:" 180
    pid=$(sed -n "s/^rank $rank: pid \([0-9]*\), start 1$/\1/p" "$work/job.log")
    [ -n "$pid" ] || { echo "no pid for rank $rank" >&2; cat "$work/job.log" >&2; exit 1; }
    echo "killing rank $rank (pid $pid) after global step $at"
    kill -9 "$pid"
    wait_for_line "$work/job.log" "^generation $((rank + 2)): every rank resumes" 180
done
status=0
wait "$job" || status=$?
cat "$work/job.log"
[ "$status" -eq 0 ] || { echo "the job failed with status $status" >&2; exit 1; }
for rank in 0 1 2 3; do
    grep -q "^rank $rank: state of global step [0-9]* from rank $(((rank + 1) % 4))'s memory" "$work/job.log" ||
        { echo "rank $rank did not get its state from its partner's memory" >&2; exit 1; }
done
from_memory=$(grep -c "^generation [2-5]: every rank resumes at global step [0-9]* (.*) from memory" "$work/job.log" || true)
[ "$from_memory" -eq 4 ] || { echo "expected 4 recoveries from memory, got $from_memory" >&2; exit 1; }
# steps redone at each recovery: the survivors' last completed step against the step resumed at
for g in 2 3 4 5; do
    resumed=$(sed -n "s/^generation $g: every rank resumes at global step \([0-9]*\) .*/\1/p" "$work/job.log")
    killed=$(((g - 1) * 20))
    done_before=$(sed -n "s/^rank [0-9]*: after global step \([0-9]*\):.*/\1/p" "$work/job.log" |
                  awk -v lo="$killed" -v hi="$((killed + 19))" '$1 >= lo && $1 <= hi' | sort -n | tail -1)
    redone=$((done_before - resumed + 1))
    echo "generation $g: resumed at $resumed after $done_before: $redone step(s) done again (K = $every)"
    [ "$redone" -le "$every" ] || { echo "more than K = $every steps done again" >&2; exit 1; }
done
same_as_straight "$work/job.log" "$launcher" "$program" "$work" --epochs 3 "$@"
