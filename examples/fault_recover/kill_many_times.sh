#!/usr/bin/env bash
# Kills a training example (fault_recover, torch_resume) with SIGKILL at random moments,
# again and again, and after each kill runs the same command again, as a job scheduler would.
# The job must end with the parameters of a run that was never killed, bit for bit; no
# restart may begin from scratch once a checkpoint exists, and some restart must resume in
# the middle of an epoch.
#   kill_many_times.sh <program> <work dir> [kills, default 24]
# The program prints "resuming from …" or "no valid checkpoint …" first (after the library's
# own "[ckpt] …" notices, which are left out of that check), "saved at epoch E,
# step S of N" once each checkpoint is durable, and final_params_xxh64=… last. Its options
# for the uninterrupted run and for the killed job (fault_recover's by default):
#   STRAIGHT_OPTIONS="--no-fault"  KILLED_OPTIONS="--fail-at-epoch 3 --save-steps 2"
# Most kills come right after the first or second checkpoint a run reports (plus 0-5 ms:
# inside a step or the next save); one in five at a random time in the run's first 0.15 s
# (its start and resume, and a few steps: longer, such kills let the job run out of steps).
set -euo pipefail
program=$1
work=$2
kills=${3:-24}
min_kills=$((kills * 5 / 6))  # the job may finish before the last few
export OPENBLAS_NUM_THREADS=1
rm -rf "$work"
mkdir -p "$work/data"

fail() {
    echo "FAIL: $*" >&2
    exit 1
}

# A small job on real data: the first 640 training and 320 test images of Fashion-MNIST
# (20 steps an epoch) in a new order each epoch, 12 epochs, a checkpoint every 2 steps, the
# scripted failure after epoch 3. Loading only these keeps each restart short; 24 kills use up some 90 to 170 of
# the 240 steps (most runs get one or two saves further).
src=/usr/share/datasets/fashion-mnist
be32() { printf "\\x$(printf %02x $(($1 >> 24 & 255)))\\x$(printf %02x $(($1 >> 16 & 255)))\\x$(printf %02x $(($1 >> 8 & 255)))\\x$(printf %02x $(($1 & 255)))"; }
subset() {  # subset <name> <count> <header bytes> <bytes per item>: the first items of an IDX file
    local whole="$work/data/whole"
    gzip -cd "$src/$1.gz" > "$whole"
    { head -c 4 "$whole"; be32 "$2"; head -c "$(($3 + $2 * $4))" "$whole" | tail -c +9; } > "$work/data/$1"
    rm "$whole"
}
subset train-images-idx3-ubyte 640 16 784
subset train-labels-idx1-ubyte 640 8 1
subset t10k-images-idx3-ubyte 320 16 784
subset t10k-labels-idx1-ubyte 320 8 1
options=(--data "$work/data" --epochs 12 --shuffle 7 --quiet)

# the reference: no failure, no kill, a checkpoint per epoch only (saving changes nothing)
read -r -a straight_options <<< "${STRAIGHT_OPTIONS---no-fault}"
read -r -a killed_options <<< "${KILLED_OPTIONS---fail-at-epoch 3 --save-steps 2}"
timeout 120 "$program" --dir "$work/straight" "${straight_options[@]}" "${options[@]}" > "$work/straight.log" 2>&1 ||
    { cat "$work/straight.log" >&2; fail "the uninterrupted run failed"; }
straight=$(grep '^final_params_xxh64=' "$work/straight.log") || fail "the uninterrupted run printed no hash"

command=("$program" --dir "$work/ckpt" "${options[@]}" "${killed_options[@]}")
echo "command: ${command[*]}"

# next_line: the job's next output line into $line and its log; false at the end of it
next_line() {
    local rc=0
    IFS= read -r -t 120 line <&"$out" || rc=$?
    if [ "$rc" -gt 128 ]; then
        kill -9 "$pid" 2> /dev/null
        fail "run $runs printed nothing for 120 s"
    fi
    [ "$rc" -eq 0 ] || [ -n "$line" ] || return 1
    printf '%s\n' "$line" >> "$log"
}

killed=0 runs=0 saved_any=no finished=no
while [ "$finished" = no ]; do
    runs=$((runs + 1))
    [ "$runs" -le $((kills * 3)) ] || fail "not finished after $runs runs"
    log="$work/run-$runs.log"
    : > "$log"
    # the job's output through a pipe, read line by line, so that a kill follows a line at once
    coproc job { exec "${command[@]}" 2>&1; }
    pid=$job_PID
    exec {out}<&"${job[0]}"
    at=""
    if [ "$killed" -lt "$kills" ]; then
        if [ $((RANDOM % 5)) -eq 0 ]; then
            ms=$((RANDOM % 150))
            sleep "0.$(printf %03d "$ms")"
            kill -9 "$pid" 2> /dev/null && at="$ms ms after its start"
        else
            saves=0 target=$((1 + RANDOM % 2))
            while next_line; do
                case $line in saved\ *) saves=$((saves + 1)) ;; *) continue ;; esac
                if [ "$saves" -ge "$target" ]; then
                    sleep "0.00$((RANDOM % 6))"
                    kill -9 "$pid" 2> /dev/null && at="after it saved ${line#saved }"
                    break
                fi
            done
        fi
    fi
    while next_line; do :; done
    exec {out}<&-
    status=0
    { wait "$pid"; } 2> /dev/null || status=$?  # without the shell's "Killed" notice
    # "saved" is printed once the file is durable: from then on every run must resume
    first=$(grep -v -m1 '^\[ckpt\]' "$log" || true)
    if [ "$saved_any" = yes ] && [ -n "$first" ] && [ "${first#resuming from }" = "$first" ]; then
        cat "$log" >&2
        fail "run $runs did not resume although earlier runs had saved checkpoints"
    fi
    if grep -q '^saved ' "$log"; then saved_any=yes; fi
    start=$(grep -m1 '^resuming from\|^no valid checkpoint' "$log" || echo "killed before it said where it starts")
    if [ -n "$at" ] && [ "$status" -eq 137 ]; then
        killed=$((killed + 1))
        echo "run $runs: SIGKILL $at; it was $start"
    elif [ "$status" -eq 0 ]; then
        finished=yes
        echo "run $runs: ran to the end; $start"
    else
        cat "$log" >&2
        fail "run $runs ended with status $status"
    fi
done

[ "$killed" -ge "$min_kills" ] ||
    fail "the job finished after $killed kills, fewer than $min_kills: it needs more steps to be killed in"
resumed=$(cat "$work"/run-*.log | grep -c '^resuming from' || true)
# "saved at epoch E, step S of N" with S < N: a checkpoint from the middle of an epoch
mid_epoch=$(cat "$work"/run-*.log | grep -o 'saved at epoch [0-9]*, step [0-9]* of [0-9]*' |
    awk '$6 + 0 < $8 + 0' | wc -l)
last=$(grep '^final_params_xxh64=' "$work/run-$runs.log") || fail "the last run printed no hash"
echo "$killed kills in $runs runs; $resumed resumed, $mid_epoch of them in the middle of an epoch"
echo "uninterrupted: $straight"
echo "killed $killed times: $last"
grep -q '^resuming from' "$work/run-$runs.log" || fail "the last run did not resume"
[ "$mid_epoch" -ge 1 ] || fail "no run resumed in the middle of an epoch"
[ "$last" = "$straight" ] || fail "the job killed $killed times ends with other parameters than the uninterrupted run"
echo "OK: bit-identical after $killed kills"
