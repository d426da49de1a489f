#!/usr/bin/env bash
# Runs the job once without interruption; then again, killed with SIGKILL from outside at
# random moments and started again with the same command each time, until it finishes; then
# once more after it finished. All must end with the same hash.
#   kill_at_random.sh PATH/TO/monte_carlo WORKDIR [extra options]
set -euo pipefail
bin=$1 work=$2
shift 2
rm -rf "$work"
mkdir -p "$work"

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

start=$(now_ms)
"$bin" --dir "$work/straight" "$@" > "$work/straight.log"
duration=$(( $(now_ms) - start ))
want=$(grep '^final_state_xxh3=' "$work/straight.log")
echo "uninterrupted run: $duration ms, $want"

# Each kill lands between 5% and 30% of an uninterrupted run's time after a start: several
# land before the job gets through, at any point of a step or of a save.
landed=0
for run in $(seq 1 40); do
    "$bin" --dir "$work/killed" "$@" > "$work/run$run.log" 2>&1 &
    pid=$!
    delay=$(( duration * (5 + RANDOM % 26) / 100 ))
    sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
    kill -KILL "$pid" 2>/dev/null || true
    set +e
    { wait "$pid"; } 2>/dev/null  # not bash's own "Killed" line
    status=$?
    set -e
    if [ "$status" -eq 137 ]; then
        landed=$((landed + 1))
        echo "run $run: killed after ${delay} ms; it had started from $(grep -o 'step [0-9]*' "$work/run$run.log" | head -1)"
        continue
    fi
    if [ "$status" -ne 0 ]; then
        cat "$work/run$run.log" >&2
        echo "FAIL: run $run ended with status $status" >&2
        exit 1
    fi
    echo "run $run: finished"
    break
done
got=$(grep '^final_state_xxh3=' "$work/run$run.log" || true)
if [ "$landed" -lt 2 ]; then
    echo "FAIL: only $landed kills landed before the job finished; the test needs a longer run" >&2
    exit 1
fi
echo "killed $landed times: $got"
if [ "$got" != "$want" ]; then
    echo "FAIL: the killed and restarted job's state differs from the uninterrupted one" >&2
    exit 1
fi

"$bin" --dir "$work/killed" "$@" > "$work/again.log"
grep -q 'the run had finished' "$work/again.log" || { echo "FAIL: a run after the end did not say it had finished" >&2; exit 1; }
again=$(grep '^final_state_xxh3=' "$work/again.log")
if [ "$again" != "$want" ]; then
    echo "FAIL: a run after the end gives another state" >&2
    exit 1
fi
echo "OK: the same state after $landed kills, and again after the end"
