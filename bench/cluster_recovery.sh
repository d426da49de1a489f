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
# With a fifth argument K, every round runs the job twice, in alternating order: recovering
# from the files as above, and with --memory-every K (recovering from the memory level);
# last line then:
#   cluster_recovery recovery_s=X memory_recovery_s=M rolled_back_steps=Y memory_rolled_back_steps=Z
#       save_every=S memory_every=K memory/files=R restore_ms files=A memory=B recovery/fresh_start=F
# (restore: from the generation's start to the state loaded, the slowest of rank 0 and, from
# memory, the restarted rank)
#
#   bench/cluster_recovery.sh <cluster_recover> <ckpt-run> [rounds] [save_every] [memory_every]
# For figures, <cluster_recover> comes from a build without the tests (-DCKPT_BUILD_TESTS=OFF),
# where the examples get the build type's optimization, not the test programs' -O1.
# CKPT_BENCH_EPOCHS (default 3) is the job's epochs of 40 steps (1: a quick run, its figures
# meaningless, its checks applied). Exit status 1 if a round did not time what it planned: a
# kill, then every rank resuming from the kind of checkpoint the round is about, a recovery
# and a fresh start of more than no time, and a step resumed from no later than the last done.
set -euo pipefail
program=$1
launcher=$2
rounds=${3:-3}
save_every=${4:-5}
memory_every=${5:-}
epochs=${CKPT_BENCH_EPOCHS:-3}
[ "$rounds" -ge 1 ] && [ "$epochs" -ge 1 ] || { echo "cluster_recovery: rounds and epochs must be at least 1" >&2; exit 2; }
work=$(mktemp -d /tmp/ckpt-bench-cluster-XXXXXX)
trap 'rm -rf "$work"' EXIT
export OPENBLAS_NUM_THREADS=1
now() { date +%s.%N; }
# wait until a line matching $2 is in $1; prints the time it was seen (polled every 5 ms).
# Fails when the job ($job) ends without it: the event the round times never came.
seen_at() {
    until grep -q "$2" "$1" 2>/dev/null; do
        if ! kill -0 "$job" 2>/dev/null; then
            grep -q "$2" "$1" && break
            echo "cluster_recovery: the job ended without a line '$2':" >&2
            tail -n 20 "$1" >&2
            return 1
        fi
        sleep 0.005
    done
    now
}
recoveries=() rolled=() starts=() restores=() mem_recoveries=() mem_rolled=() mem_restores=()
# run_job <dir> <options…>: one job, rank 2 killed after step 30; sets recovery, back, start
run_job() {
    local dir=$1 t0 t1 tk tr job pid resumed last
    shift
    mkdir -p "$dir"
    t0=$(now)
    "$launcher" --nproc 4 --store "file://$dir/store" --max-restarts 1 -- "$program" --dir "$dir/ckpt" \
        --epochs "$epochs" --save-every "$save_every" --cooldown-ms 0 "$@" > "$dir/job.log" 2>&1 &
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
    from=$(sed -n 's/^generation 2: every rank resumes at global step [0-9]* ([^)]*) from \([a-z]*\).*/\1/p' "$dir/job.log")
    # the slowest of rank 0's restore and (from memory) the restarted rank's
    restore=$( (sed -n 's/^generation 2: .*state restored in \([0-9.]*\) ms$/\1/p' "$dir/job.log"
                sed -n "s/^rank 2: state of global step [0-9]* from .* in \([0-9.]*\) ms$/\1/p" "$dir/job.log") | sort -g | tail -1)
    # what the round timed: a resumption after the kill, and times of more than nothing
    [ -n "$resumed" ] && [ -n "$last" ] && [ -n "$restore" ] ||
        { echo "cluster_recovery: no step resumed, last step done or restore time in the job's log:" >&2
          tail -n 20 "$dir/job.log" >&2; exit 1; }
    back=$((last - (resumed - 1)))
    awk -v r="$recovery" -v s="$start" -v b="$back" 'BEGIN { exit !(r > 0 && s > 0 && b >= 0) }' ||
        { echo "cluster_recovery: implausible: recovery ${recovery} s, fresh start ${start} s, ${back} steps done again" >&2; exit 1; }
}
for round in $(seq 1 "$rounds"); do
    modes=(files)
    if [ -n "$memory_every" ]; then
        if [ $((round % 2)) -eq 1 ]; then modes=(files memory); else modes=(memory files); fi
    fi
    for mode in "${modes[@]}"; do
        if [ "$mode" = files ]; then
            run_job "$work/round$round-files"
            [ "$from" = its ] || { echo "round $round: the files run did not recover from its files" >&2; exit 1; }
            printf 'round %d: recovery from files %.3f s (state restored in %s ms; %d steps done again), fresh start %.3f s\n' \
                "$round" "$recovery" "$restore" "$back" "$start"
            recoveries+=("$recovery") rolled+=("$back") starts+=("$start") restores+=("$restore")
        else
            run_job "$work/round$round-memory" --memory-every "$memory_every"
            [ "$from" = memory ] || { echo "round $round: the memory run did not recover from memory" >&2; exit 1; }
            printf 'round %d: recovery from memory %.3f s (state restored in %s ms; %d steps done again)\n' \
                "$round" "$recovery" "$restore" "$back"
            mem_recoveries+=("$recovery") mem_rolled+=("$back") mem_restores+=("$restore")
        fi
    done
done
median() { printf '%s\n' "$@" | sort -g | sed -n "$(( ($# + 1) / 2 ))p"; }
r=$(median "${recoveries[@]}") b=$(median "${rolled[@]}") s=$(median "${starts[@]}")
if [ -z "$memory_every" ]; then
    printf 'cluster_recovery recovery_s=%.3f rolled_back_steps=%d save_every=%d recovery/fresh_start=%.2f\n' \
        "$r" "$b" "$save_every" "$(awk -v a="$r" -v b="$s" 'BEGIN { print a / b }')"
else
    m=$(median "${mem_recoveries[@]}") mb=$(median "${mem_rolled[@]}")
    fr=$(median "${restores[@]}") mr=$(median "${mem_restores[@]}")
    printf 'cluster_recovery recovery_s=%.3f memory_recovery_s=%.3f rolled_back_steps=%d memory_rolled_back_steps=%d save_every=%d memory_every=%d memory/files=%.2f restore_ms files=%s memory=%s recovery/fresh_start=%.2f\n' \
        "$r" "$m" "$b" "$mb" "$save_every" "$memory_every" "$(awk -v a="$m" -v b="$r" 'BEGIN { print a / b }')" \
        "$fr" "$mr" "$(awk -v a="$r" -v b="$s" 'BEGIN { print a / b }')"
fi
