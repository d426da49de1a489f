#!/usr/bin/env bash
# The heat solver under mpirun, one rank SIGKILLed from outside mid-run (which ends an Open
# MPI job), then the job run again; its final field must equal, bit for bit, that of a run
# that never stopped.
#   kill_and_resume.sh PATH/TO/heat_mpi WORKDIR SCENARIO [HASH_FILE]
#     straight    only the uninterrupted run, its hash written to HASH_FILE
#     same        4 ranks, rank 2 killed, run again on 4 ranks: resumes from the local level;
#                 then, finished, run again three times: each ends at once, writing and
#                 deleting nothing; then run longer (--iters 650): goes on from iteration 600
#                 to the field of an uninterrupted 650-iteration run. Every run of this
#                 scenario saves with --async (the index committed once the files are durable)
#     reshard     4 ranks, rank 1 killed, run again on 3 ranks and (from a copy of the same
#                 checkpoints) on 2: each resumes from the 4-rank checkpoint by resharding
#     local-lost  4 ranks, rank 3 killed, the local level deleted, run again on 4 ranks:
#                 resumes from the shared level
# The scenarios compare with the hash in HASH_FILE when it is given (a straight run's), else
# they make the uninterrupted run first.
set -euo pipefail
bin=$1 work=$2 scenario=$3 hash_file=${4:-}
mpirun=$(cd "$(dirname "$0")/../.." && pwd)/scripts/mpirun.sh
grid=(--rows 96 --cols 96 --iters 600 --every 50 --copy-every 2)
saves=()
[ "$scenario" = same ] && saves=(--async)
run() {  # ranks, job directory, more options
    local ranks=$1 dir=$2
    shift 2
    bash "$mpirun" -np "$ranks" "$bin" --local "$dir/local" --shared "$dir/shared" "${grid[@]}" "${saves[@]}" "$@"
}
hash_of() { grep '^final_field_xxh3=' "$1" | cut -d= -f2; }
fail() { echo "FAIL: $*" >&2; exit 1; }

rm -rf "$work"
mkdir -p "$work"
if [ "$scenario" = straight ] || [ -z "$hash_file" ]; then
    echo "== uninterrupted run, 4 ranks"
    run 4 "$work/straight" > "$work/straight.log"
    straight=$(hash_of "$work/straight.log")
    [ -n "$straight" ] || fail "the uninterrupted run printed no hash"
    echo "final_field_xxh3=$straight"
    if [ "$scenario" = straight ]; then
        [ -n "$hash_file" ] || { echo "straight: no HASH_FILE to write" >&2; exit 2; }
        echo "$straight" > "$hash_file"
        exit 0
    fi
else
    straight=$(cat "$hash_file")
    [ -n "$straight" ] || fail "no hash in $hash_file"
    echo "the uninterrupted run's: final_field_xxh3=$straight"
fi

victim=$(case "$scenario" in same) echo 2 ;; reshard) echo 1 ;; local-lost) echo 3 ;; *) echo "unknown scenario '$scenario'" >&2; exit 2 ;; esac)
echo "== 4 ranks, rank $victim killed with SIGKILL once step 300 is indexed"
run 4 "$work/job" --pace-ms 4 > "$work/killed.log" 2>&1 &
job=$!
for _ in $(seq 600); do
    [ -e "$work/job/local/index-step_300.ckpt" ] && break
    kill -0 "$job" 2> /dev/null || break
    sleep 0.05
done
[ -e "$work/job/local/index-step_300.ckpt" ] || { cat "$work/killed.log"; fail "step 300 was never indexed"; }
killed=
for pid in $(pgrep -f -- "--local $work/job/local" || true); do
    # the rank's own process: mpirun passes its rank in the environment (mpirun has none)
    if tr '\0' '\n' < "/proc/$pid/environ" 2> /dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$victim"; then
        kill -KILL "$pid"
        killed=$pid
    fi
done
[ -n "$killed" ] || fail "rank $victim's process was not found"
set +e
wait "$job"
status=$?
set -e
grep -v '^iteration ' "$work/killed.log" | sed 's/^/  | /'
[ "$status" -ne 0 ] || fail "the job went on after rank $victim died (mpirun exited 0)"
grep -q '^final_field_xxh3=' "$work/killed.log" && fail "the killed job finished"
echo "mpirun exited with status $status after the kill"

check() {  # log, which level it must resume from
    grep '^resuming from ' "$1" || fail "the run did not resume: $(head -3 "$1")"
    grep -q "^resuming from $work/[a-z0-9-]*/$2/index-step_" "$1" || fail "it did not resume from the $2 level"
    local got
    got=$(hash_of "$1")
    echo "final_field_xxh3=$got"
    [ "$got" = "$straight" ] || fail "the resumed field differs from the uninterrupted one"
}
case "$scenario" in
same)
    echo "== run again, 4 ranks"
    run 4 "$work/job" > "$work/resumed.log"
    check "$work/resumed.log" local
    # every file of both levels, its size and time of change; the locks' text says who holds them
    files() { find "$work/job" -type f ! -name '*.lock' -printf '%P %s %C@\n' | sort; }
    before=$(files)
    for again in 1 2 3; do
        echo "== finished: the same command again ($again)"
        run 4 "$work/job" > "$work/again-$again.log" 2>&1
        grep -q "^resuming from $work/job/local/index-step_600.ckpt" "$work/again-$again.log" ||
            fail "run $again did not find the finished step: $(head -3 "$work/again-$again.log")"
        grep -q 'had already finished' "$work/again-$again.log" || fail "run $again did not say the job had finished"
        [ "$(hash_of "$work/again-$again.log")" = "$straight" ] || fail "run $again ends with another field"
        [ "$(files)" = "$before" ] || fail "run $again of a finished job changed its files: $(diff <(echo "$before") <(files))"
    done
    echo "== run longer: --iters 650"
    run 4 "$work/job" --iters 650 > "$work/longer.log"
    grep -q "^resuming from $work/job/local/index-step_600.ckpt" "$work/longer.log" ||
        fail "the longer run did not go on from iteration 600: $(head -3 "$work/longer.log")"
    run 4 "$work/straight-650" --iters 650 > "$work/straight-650.log"
    [ "$(hash_of "$work/longer.log")" = "$(hash_of "$work/straight-650.log")" ] ||
        fail "the run extended to 650 iterations differs from an uninterrupted one"
    echo "extended to 650: final_field_xxh3=$(hash_of "$work/longer.log"), as an uninterrupted run"
    ;;
reshard)
    cp -a "$work/job" "$work/job-2"
    echo "== run again, 3 ranks"
    run 3 "$work/job" > "$work/resumed-3.log"
    check "$work/resumed-3.log" local
    grep -q 'saved by 4 ranks, now 3' "$work/resumed-3.log" || fail "3 ranks did not load the 4-rank checkpoint"
    echo "== the same checkpoints, run again on 2 ranks"
    run 2 "$work/job-2" > "$work/resumed-2.log"
    check "$work/resumed-2.log" local
    grep -q 'saved by 4 ranks, now 2' "$work/resumed-2.log" || fail "2 ranks did not load the 4-rank checkpoint"
    ;;
local-lost)
    echo "== the local level lost; run again, 4 ranks"
    rm -rf "$work/job/local"
    run 4 "$work/job" > "$work/resumed.log"
    check "$work/resumed.log" shared
    ;;
esac
echo "OK: $scenario: bit-identical to the uninterrupted run"
