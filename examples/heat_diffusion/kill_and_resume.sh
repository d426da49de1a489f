#!/usr/bin/env bash
# Runs the solver once without interruption and once killed with SIGKILL mid-run and then
# restarted, and checks that both end with the same grid, bit for bit.
#   kill_and_resume.sh PATH/TO/heat_diffusion WORKDIR [extra solver options]
set -euo pipefail
bin=$1 work=$2
shift 2
rm -rf "$work"
mkdir -p "$work"

echo "== uninterrupted run"
"$bin" --dir "$work/straight" "$@" | tee "$work/straight.log"

echo "== run killed after iteration 1700"
set +e
"$bin" --dir "$work/killed" --kill-at 1700 "$@" > "$work/killed.log" 2>&1
status=$?
set -e
cat "$work/killed.log"
if [ "$status" -ne 137 ]; then
    echo "expected the run to die by SIGKILL (exit status 137), got $status" >&2
    exit 1
fi
echo "checkpoint directory after the kill:"
ls -1 "$work/killed" | sed 's/^/  /'

echo "== restarted run"
"$bin" --dir "$work/killed" "$@" | tee "$work/resumed.log"
grep -q '^resuming from ' "$work/resumed.log" || { echo "the restarted run did not resume" >&2; exit 1; }

straight=$(grep '^final_grid_xxh3=' "$work/straight.log")
resumed=$(grep '^final_grid_xxh3=' "$work/resumed.log")
echo "uninterrupted: $straight"
echo "resumed:       $resumed"
if [ "$straight" != "$resumed" ]; then
    echo "FAIL: the resumed grid differs from the uninterrupted one" >&2
    exit 1
fi
echo "OK: bit-identical after SIGKILL and resume"
