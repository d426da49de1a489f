#!/usr/bin/env bash
# A worker killed in the middle of sending its memory copy: four workers under ckpt-run with
# --memory-every K; rank R kills itself with SIGKILL after sending the length of its N-th copy
# (global step N*K), before the copy itself, and ckpt-run starts it again. Its partner must
# never use the half-received copy: recovery takes the previous whole one, of step (N-1)*K.
# Every rank must end bit-identical to a run in which no worker died.
#   die_in_transfer.sh <cluster_recover> <ckpt-run> <work dir> N R --memory-every K [options]
set -euo pipefail
program=$1
launcher=$2
work=$3
transfer=$4
rank=$5
shift 5
export OPENBLAS_NUM_THREADS=1
rm -rf "$work"
mkdir -p "$work"
source "$(dirname "$0")/common.sh"
every=$(memory_every "$@")
[ -n "$every" ] || { echo "die_in_transfer.sh needs --memory-every K" >&2; exit 2; }

status=0
"$launcher" --nproc 4 --store "file://$work/store" --max-restarts 1 -- \
    "$program" --dir "$work/checkpoints" --die-in-transfer "$transfer" --die-rank "$rank" "$@" \
    > "$work/job.log" 2>&1 || status=$?
cat "$work/job.log"
[ "$status" -eq 0 ] || { echo "the job failed with status $status" >&2; exit 1; }
grep -q "^ckpt-run: rank $rank (pid [0-9]*) was killed by signal 9" "$work/job.log" ||
    { echo "rank $rank did not die" >&2; exit 1; }
whole=$(((transfer - 1) * every))
grep -q "^rank $rank: state of global step $whole from rank $(((rank + 1) % 4))'s memory" "$work/job.log" ||
    { echo "rank $rank did not get its whole copy of step $whole from its partner's memory" >&2; exit 1; }
grep -q "every rank resumes at global step $((whole + 1)) (.*) from memory" "$work/job.log" ||
    { echo "the ranks did not resume from memory after step $whole" >&2; exit 1; }
echo "the copy cut off at step $((transfer * every)) was not used: every rank resumed after step $whole"
same_as_straight "$work/job.log" "$launcher" "$program" "$work" "$@"
