#!/usr/bin/env bash
# Async saves with a global index on the MPI solver (examples/heat_mpi): how long its
# iterations take with no checkpoint, with synchronous saves (each rank waits for its write,
# then the ranks commit the step's index) and with --async (the write in the background, the
# index committed once every rank's file is durable: fault::IndexCommitter). Each round runs
# a fresh job of each, in rotating order; the checkpoints go to a directory on disk (fsync
# real), every --copy-every K-th one copied to a second directory as the example does.
#   overhead = (iterations' time with checkpoints - without) / without
# and, apart, the time rank 0's loop spent in the checkpoint calls (the save, the index's
# commit or the poll for it). Printed: the medians, and async / sync of both (the target for
# the overhead: at most 0.5).
#
#   bash bench/heat_mpi_async.sh <heat_mpi> [--np P] [--rounds N] [--rows R] [--cols C]
#        [--iters I] [--every K] [--copy-every K] [--dir DIR]
# Last line: heat_mpi_async ranks=P none_s=A sync_s=B async_s=C sync_overhead=D async_overhead=E
#            async/sync=F calls_sync_s=G calls_async_s=H calls_async/sync=I
# For figures, <heat_mpi> comes from a build without the tests (-DCKPT_BUILD_TESTS=OFF), where
# the examples get the build type's optimization. Exit status 1 if a run did not time what it
# planned: each run's iterations ran; those with checkpoints saved iters/every in them and
# committed an index of each; no run took no time.
set -euo pipefail
program=${1:?usage: heat_mpi_async.sh <heat_mpi> [--np P] [--rounds N] [--rows R] [--cols C] [--iters I] [--every K] [--copy-every K] [--dir DIR]}
shift
np=2 rounds=5 rows=1024 cols=1024 iters=1600 every=200 copy_every=2 dir=
while [ $# -gt 0 ]; do
    case "$1" in
    --np) np=$2 ;;
    --rounds) rounds=$2 ;;
    --rows) rows=$2 ;;
    --cols) cols=$2 ;;
    --iters) iters=$2 ;;
    --every) every=$2 ;;
    --copy-every) copy_every=$2 ;;
    --dir) dir=$2 ;;
    *) echo "heat_mpi_async: unknown option $1" >&2; exit 2 ;;
    esac
    shift 2
done
[ "$rounds" -ge 1 ] && [ "$every" -le "$iters" ] || { echo "heat_mpi_async: rounds >= 1 and every <= iters" >&2; exit 2; }
cd "$(dirname "$0")/.."
if [ -z "$dir" ]; then
    work=$(mktemp -d /var/tmp/ckpt-bench-heat-XXXXXX)
    trap 'rm -rf "$work"' EXIT
else
    work=$dir
    mkdir -p "$work"
fi
export OPENBLAS_NUM_THREADS=1
planned=$((iters / every))
# what a run found wrong, a line each (run() runs in a subshell)
failures=$work/failures
: > "$failures"
# run <mode>: one fresh job; prints the iterations' seconds and those in checkpoint calls
run() {
    local mode=$1 log="$work/$1.log" flags=()
    rm -rf "$work/local" "$work/shared"
    case "$mode" in
    none) flags=(--every $((iters + 1))) ;;
    sync) flags=(--every "$every") ;;
    async) flags=(--every "$every" --async) ;;
    esac
    bash scripts/mpirun.sh -np "$np" "$program" --local "$work/local" --shared "$work/shared" --rows "$rows" \
        --cols "$cols" --iters "$iters" --copy-every "$copy_every" "${flags[@]}" > "$log" 2>&1 ||
        { echo "heat_mpi_async: the $mode run failed:" >&2; cat "$log" >&2; exit 1; }
    local line seconds calls saves indexes
    line=$(grep '^iterations took ' "$log") || { echo "heat_mpi_async: the $mode run said no time" >&2; exit 1; }
    read -r seconds calls saves indexes < <(sed -E \
        's/^iterations took ([0-9.]+) s, ([0-9.]+) s of it in checkpoint calls; ([0-9]+) checkpoint.* ([0-9]+) index.*/\1 \2 \3 \4/' <<< "$line")
    local want=$planned
    [ "$mode" = none ] && want=0
    if [ "$saves" -ne "$want" ] || { [ "$mode" != none ] && [ "$indexes" -lt "$saves" ]; }; then
        echo "the $mode run saved $saves checkpoint(s) in its iterations (planned $want) and committed $indexes index(es)" >> "$failures"
    fi
    if awk -v s="$seconds" 'BEGIN { exit !(s <= 0) }'; then
        echo "the $mode run timed no iterations" >> "$failures"
    fi
    echo "$seconds $calls"
}
modes=(none sync async)
none=() sync=() async=() sync_calls=() async_calls=()
for ((r = 0; r < rounds; r++)); do
    for ((k = 0; k < 3; k++)); do
        mode=${modes[$(((r + k) % 3))]}
        read -r t calls < <(run "$mode")
        case "$mode" in
        none) none+=("$t") ;;
        sync) sync+=("$t") sync_calls+=("$calls") ;;
        async) async+=("$t") async_calls+=("$calls") ;;
        esac
        echo "heat_mpi_async: round $((r + 1)) $mode: $t s, $calls s in checkpoint calls"
    done
done
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
m_none=$(median "${none[@]}")
m_sync=$(median "${sync[@]}")
m_async=$(median "${async[@]}")
m_sync_calls=$(median "${sync_calls[@]}")
m_async_calls=$(median "${async_calls[@]}")
if [ -s "$failures" ]; then
    sed 's/^/heat_mpi_async: /' "$failures" >&2
    echo "heat_mpi_async: $(wc -l < "$failures") run(s) did not time what they planned" >&2
    exit 1
fi
awk -v np="$np" -v n="$m_none" -v s="$m_sync" -v a="$m_async" -v cs="$m_sync_calls" -v ca="$m_async_calls" 'BEGIN {
    so = (s - n) / n; ao = (a - n) / n
    printf "heat_mpi_async ranks=%d none_s=%.4f sync_s=%.4f async_s=%.4f sync_overhead=%.4f async_overhead=%.4f async/sync=%.3f", \
        np, n, s, a, so, ao, (so > 0 ? ao / so : 0)
    printf " calls_sync_s=%.4f calls_async_s=%.4f calls_async/sync=%.3f\n", cs, ca, (cs > 0 ? ca / cs : 0)
}'
