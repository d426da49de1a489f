#!/usr/bin/env bash
# Every benchmark once on a small size, for scripts/test.sh --all. The figures of such a run
# mean nothing; what it keeps working is the bench itself, whose checks of what it timed (the
# saves, loads, copies, collectives and steps it planned, the figures it divides by) fail it
# when it times nothing. The programs are bench_checks' (-O0, <build>/bench/<name>_check):
#   cmake --build build --target bench_checks && bash scripts/bench_smoke.sh [build]
# Each bench's output goes to <build>/bench-smoke/<name>.log, and to stderr when it fails.
# The benches the build has no program for (configured without Gloo, MPI or libtorch) are
# said to be skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bin=$build/bench
logs=$build/bench-smoke
mkdir -p "$logs"
# in memory when there is /dev/shm: the disk, which the build beside shares, makes no fsync
# wait long enough for a check that the writer keeps up (async_ckpt) to fail
base=/var/tmp
[ -d /dev/shm ] && [ -w /dev/shm ] && base=/dev/shm
work=$(mktemp -d "$base/ckpt-bench-smoke-XXXXXX")
trap 'rm -rf "$work"' EXIT
export OPENBLAS_NUM_THREADS=1
failed=()
now() { date +%s.%N; }
# smoke <name> <command...>: runs it, says how long it took, shows its log when it fails
smoke() {
    local name=$1 t0 rc=0
    shift
    t0=$(now)
    "$@" > "$logs/$name.log" 2>&1 || rc=$?
    local took
    took=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
    if [ "$rc" -eq 0 ]; then
        echo "bench_smoke: $name: $took s"
    else
        echo "bench_smoke: $name failed (exit status $rc) after $took s:" >&2
        cat "$logs/$name.log" >&2
        failed+=("$name")
    fi
}
# program <name>: the bench's -O0 program, or nothing (and a line saying so) when not built
program() {
    if [ -x "$bin/$1_check" ]; then echo "$bin/$1_check"; else echo "bench_smoke: $1: skipped (not built)" >&2; fi
}

p=$(program ckpt_io) && [ -n "$p" ] && smoke ckpt_io "$p" --rounds 1 --tensors 2 --dir "$work"
p=$(program partial_read) && [ -n "$p" ] && smoke partial_read "$p" --mib 8 --rounds 1 --dir "$work"
p=$(program parallel_writes) && [ -n "$p" ] && smoke parallel_writes "$p" --mib 8 --rounds 1 --dir "$work"
p=$(program interop_io) && [ -n "$p" ] && smoke interop_io "$p" --rounds 1 --tensors 2 --dir "$work"
p=$(program parse_scaling) && [ -n "$p" ] && smoke parse_scaling "$p" --entries 200 --rounds 1 --dir "$work"
p=$(program map_state) && [ -n "$p" ] && smoke map_state "$p" --entries 200 --rounds 1 --dir "$work"
p=$(program durable_level) && [ -n "$p" ] &&
    smoke durable_level "$p" --mib 4 --saves 2 --gap-ms 100 --rounds 1 --dir "$work"
p=$(program reshard) && [ -n "$p" ] && smoke reshard "$p" --rounds 1 --side 256 --dir "$work"
p=$(program replica_parallel) && [ -n "$p" ] && smoke replica_parallel "$p" --mib 4 --rounds 1 --rate 400e6 --dir "$work"
p=$(program codec_io) && [ -n "$p" ] &&
    smoke codec_io "$p" --rounds 1 --dp-rounds 1 --stall-rounds 1 --small-rounds 1 --lenet-images 320 --dp-steps 2 \
        --net small --tensors 2 --dir "$work"
p=$(program train_lenet) && [ -n "$p" ] && smoke train_lenet "$p" --images 320 --rounds 1
p=$(program async_ckpt) && [ -n "$p" ] && smoke async_ckpt "$p" --every 20 --pairs 2 --net small --dir "$work/async"
p=$(program memory_level) && [ -n "$p" ] && smoke memory_level "$p" --net small --steps 2 --pairs 2
p=$(program fault_recovery) && [ -n "$p" ] && smoke fault_recovery "$p" --rounds 1 --net small --dir "$work"
p=$(program gloo_allreduce) && [ -n "$p" ] && smoke gloo_allreduce "$p" --ranks 2 --reps 1 --max-mib 1 --dir "$work"
p=$(program mpi_comm) && [ -n "$p" ] &&
    smoke mpi_comm bash scripts/mpirun.sh -np 2 "$p" --reps 1 --max-mib 1 --state-mib 1
if [ -x "$build/examples/heat_mpi/heat_mpi" ]; then
    smoke heat_mpi_async bash bench/heat_mpi_async.sh "$build/examples/heat_mpi/heat_mpi" --rounds 1 --rows 64 --cols 64 \
        --iters 40 --every 10 --dir "$work/heat_mpi_async"
else
    echo "bench_smoke: heat_mpi_async: skipped (examples/heat_mpi not built)" >&2
fi
p=$(program torch_io) && [ -n "$p" ] && smoke torch_io "$p" "$work" --rounds 1 --width 256 --train-width 256
smoke python_io /usr/bin/python3 bench/python_io.py --mib 4 --rounds 1 --dir "$work/python_io"
smoke partial_read_py /usr/bin/python3 bench/partial_read.py --mib 8 --rounds 1 --dir "$work"
if [ -x "$build/examples/cluster_recover/cluster_recover" ] && [ -x "$build/ckpt-run" ]; then
    CKPT_BENCH_EPOCHS=1 smoke cluster_recovery bash bench/cluster_recovery.sh \
        "$build/examples/cluster_recover/cluster_recover" "$build/ckpt-run" 1
    smoke failure_reports bash bench/failure_reports.sh "$build/examples/cluster_recover/cluster_recover" "$build/ckpt-run" 1
else
    echo "bench_smoke: cluster_recovery, failure_reports: skipped (examples/cluster_recover or ckpt-run not built)" >&2
fi
# the compiled cases link against this build's library rather than compile one more
if [ -f "$build/libckpt_compiled.a" ]; then
    CKPT_COMPILED_LIBRARY=$(cd "$build" && pwd)/libckpt_compiled.a smoke compile_cost bash bench/compile_cost.sh 1 -O0
else
    smoke compile_cost bash bench/compile_cost.sh 1 -O0
fi

[ ${#failed[@]} -eq 0 ] || { echo "bench_smoke: failed: ${failed[*]}" >&2; exit 1; }
echo "bench_smoke: every benchmark ran and timed what it planned"
