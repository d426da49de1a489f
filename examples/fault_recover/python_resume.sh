#!/usr/bin/env bash
# A checkpoint written by the Python package (python/ckpt) is what fault_recover resumes from.
# A short job is killed with SIGKILL after its second checkpoint; Python finds the newest with
# ckpt.latest, loads it, and saves it as the next run's file at the same epoch and step
# (edit_checkpoint.py); the same command run again must resume from that file, which shows:
#  1. saved unchanged, the job ends bit-identical to a run that was never killed: the Python
#     file holds the whole state (parameters, momentum, position, data order);
#  2. with the classifier re-initialized in NumPy, the job ends with the parameters of a
#     resume from the same edit made another way (`ckpt export` to safetensors, NumPy alone,
#     `ckpt import`: the C++ reader and writer), and not with those of 1: the edit counted.
#   python_resume.sh <fault_recover> <ckpt tool> <work dir>
set -euo pipefail
program=$1
tool=$2
work=$3
here=$(cd "$(dirname "$0")" && pwd)
python=/usr/bin/python3  # Debian's, with python3-numpy and python3-xxhash
export PYTHONPATH=$here/../../python${PYTHONPATH:+:$PYTHONPATH}
export OPENBLAS_NUM_THREADS=1
edit=("$python" "$here/edit_checkpoint.py")
rm -rf "$work"
mkdir -p "$work"
fail() {
    echo "FAIL: $*" >&2
    exit 1
}
# 640 training images (20 steps an epoch) in a new order each epoch, a checkpoint every 5 steps
options=(--epochs 3 --limit 640 --test-limit 320 --shuffle 7 --save-steps 5 --no-fault --quiet)
seed=5  # of the re-initialized classifier

# run <dir> <log>: the job's command, run to its end; its final hash into $hash
run() {
    timeout 120 "$program" --dir "$1" "${options[@]}" > "$2" 2>&1 || { cat "$2" >&2; fail "fault_recover --dir $1 failed"; }
    hash=$(grep '^final_params_xxh64=' "$2") || { cat "$2" >&2; fail "fault_recover --dir $1 printed no hash"; }
}
# resumed <dir> <log> <file>: the run in <log> said first that it resumed from <file>
resumed() {
    local first
    first=$(head -n 1 "$2")
    case $first in "resuming from $3: "*) ;; *) cat "$2" >&2; fail "the run in $1 did not resume from $3" ;; esac
    echo "  ${first%%;*}"
}

run "$work/straight" "$work/straight.log"
straight=$hash
echo "uninterrupted: $straight"

# the job, SIGKILLed as soon as it reports its second checkpoint (it may save one more first)
coproc job { exec "$program" --dir "$work/job" "${options[@]}" 2>&1; }
pid=$job_PID
exec {out}<&"${job[0]}"
saves=0
while [ "$saves" -lt 2 ]; do
    rc=0
    IFS= read -r -t 60 line <&"$out" || rc=$?
    if [ "$rc" -ne 0 ]; then
        kill -9 "$pid" 2> /dev/null || true
        cat "$work/killed.log" >&2
        fail "the job ended or printed nothing for 60 s before its second checkpoint (read status $rc)"
    fi
    printf '%s\n' "$line" >> "$work/killed.log"
    case $line in saved\ *) saves=$((saves + 1)) ;; esac
done
status=0
{  # the rest of its output, and its status, without the shell's "Killed" notice
    kill -9 "$pid" || true
    while IFS= read -r -t 60 line <&"$out"; do printf '%s\n' "$line" >> "$work/killed.log"; done
    wait "$pid"
} 2> /dev/null || status=$?
exec {out}<&-
[ "$status" -eq 137 ] || { cat "$work/killed.log" >&2; fail "the job was not killed: status $status"; }
! grep -q '^final_params_xxh64=' "$work/killed.log" || fail "the job finished before it was killed"
cp -a "$work/job" "$work/resaved"
cp -a "$work/job" "$work/imported"
newest=$("${edit[@]}" newest "$work/job")
read -r epoch step name newest <<< "$newest"
echo "killed after $(grep -c '^saved ' "$work/killed.log") checkpoints; the newest: ${newest##*/} (epoch $epoch, step $step)"

# 1. loaded and saved unchanged by Python: the job ends as if never killed
file=$("${edit[@]}" resave "$work/resaved")
[ "$file" = "$work/resaved/$name" ] || fail "Python saved $file, not $work/resaved/$name"
run "$work/resaved" "$work/resaved.log"
resumed "$work/resaved" "$work/resaved.log" "$file"
echo "  after a Python load and save, unchanged: $hash"
[ "$hash" = "$straight" ] || fail "resumed from the file Python saved unchanged, the job ends otherwise than uninterrupted"

# 2. the classifier re-initialized in Python, in the job's own directory, the same command again
edited=$("${edit[@]}" reinit "$work/job" "$seed")
[ "$edited" = "$work/job/$name" ] || fail "Python saved $edited, not $work/job/$name"
# the same edit made with the C++ tool and NumPy alone, on the checkpoint exported to safetensors
"$tool" export "$newest" "$work/state.safetensors" > /dev/null
"${edit[@]}" reinit-safetensors "$work/state.safetensors" "$work/edited.safetensors" "$seed"
"$tool" import "$work/edited.safetensors" "$work/imported/$name" --epoch "$epoch" --step "$step" > /dev/null
"$tool" diff "$work/imported/$name" "$edited" > "$work/diff.log" ||
    { cat "$work/diff.log" >&2; fail "the Python file and the one the C++ tool wrote hold other entries"; }
"$tool" diff "$newest" "$edited" > "$work/diff.log" && fail "the edited file holds what the killed job saved"
run "$work/job" "$work/resumed.log"
resumed "$work/job" "$work/resumed.log" "$edited"
python_edit=$hash
run "$work/imported" "$work/imported.log"
resumed "$work/imported" "$work/imported.log" "$work/imported/$name"
echo "  classifier re-initialized, saved by Python: $python_edit"
echo "  the same edit through ckpt export/import:   $hash"
[ "$python_edit" = "$hash" ] || fail "the job resumed from Python's edit ends otherwise than from the same edit made in C++"
[ "$python_edit" != "$straight" ] || fail "the edit changed nothing: the job ends as the uninterrupted run"
echo "OK"
