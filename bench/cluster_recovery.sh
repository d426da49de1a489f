#!/usr/bin/env bash
# Cluster recovery (seed 004) timed: 4 cluster_recover workers under ckpt-run on loopback,
# the seed's 784-512-512-10 network; after global step 30 a worker is killed with SIGKILL
# and ckpt-run starts it again. Measured, per round:
#   recovery   from the kill to the line saying every rank resumes, minus the cooldown
#              (set to 0 here: the newcomer may register at once)
#   rolled back  the steps done again: the survivors' last completed step - the step resumed from
#   baseline   a fresh start of the same job: from ckpt-run's launch to the first
#              generation's first line (processes, data, rendezvous), in the same round
# Rounds alternate the two. Last line:
#   cluster_recovery recovery_s=X rolled_back_steps=Y save_every=Z recovery/fresh_start=R
#
#   bench/cluster_recovery.sh <cluster_recover> <ckpt-run> [rounds] [save_every]
set -euo pipefail
program=$1
launcher=$2
rounds=${3:-3}
save_every=${4:-5}
work=$(mktemp -d /tmp/ckpt-bench-cluster-XXXXXX)
trap 'rm -rf "$work"' EXIT
export OPENBLAS_NUM_THREADS=1
now() { date +%s.%N; }
# wait until a line matching $2 is in $1; prints the time it was seen (polled every 5 ms)
seen_at() {
    until grep -q "$2" "$1" 2>/dev/null; do sleep 0.005; done
    now
}
recoveries=() rolled=() starts=()
for round in $(seq 1 "$rounds"); do
    dir="$work/round$round"
    mkdir -p "$dir"
    t0=$(now)
    "$launcher" --nproc 4 --store "file://$dir/store" --max-restarts 1 -- "$program" --dir "$dir/ckpt" \
        --epochs 3 --save-every "$save_every" --cooldown-ms 0 > "$dir/job.log" 2>&1 &
    job=$!
    t1=$(seen_at "$dir/job.log" "^generation 1:")
    seen_at "$dir/job.log" "^step 30:" > /dev/null
    pid=$(sed -n "s/^rank 2: pid \([0-9]*\), start 1$/\1/p" "$dir/job.log")
    tk=$(now)
    kill -9 "$pid"
    tr=$(seen_at "$dir/job.log" "^generation 2: every rank resumes")
    wait "$job"
    resumed=$(sed -n 's/^generation 2: every rank resumes at global step \([0-9]*\).*/\1/p' "$dir/job.log")
    last=$(sed -n 's/^rank [013]: after global step \([0-9]*\):.*/\1/p' "$dir/job.log" | sort -n | tail -1)
    recovery=$(awk -v a="$tr" -v b="$tk" 'BEGIN { printf "%.3f", a - b }')
    start=$(awk -v a="$t1" -v b="$t0" 'BEGIN { printf "%.3f", a - b }')
    back=$((last - (resumed - 1)))
    printf 'round %d: recovery %.3f s (resumed at step %d, survivors had done %d: %d done again), fresh start %.3f s\n' \
        "$round" "$recovery" "$resumed" "$last" "$back" "$start"
    recoveries+=("$recovery") rolled+=("$back") starts+=("$start")
done
median() { printf '%s\n' "$@" | sort -g | sed -n "$(( ($# + 1) / 2 ))p"; }
r=$(median "${recoveries[@]}") b=$(median "${rolled[@]}") s=$(median "${starts[@]}")
printf 'cluster_recovery recovery_s=%.3f rolled_back_steps=%d save_every=%d recovery/fresh_start=%.2f\n' \
    "$r" "$b" "$save_every" "$(awk -v a="$r" -v b="$s" 'BEGIN { print a / b }')"
