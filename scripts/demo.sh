#!/usr/bin/env bash
# The main job: the seed's fault-recovery tutorial on Fashion-MNIST. LeNet5 trains for 10
# epochs with a checkpoint per epoch (keep 5), fails after epoch 6, finds the latest
# checkpoint, loads it and resumes to epoch 10. A second run that never fails must end
# with the same parameters, bit for bit. A third run, with a checkpoint every 625 steps as
# well, is killed from outside with SIGKILL in the middle of an epoch; the same command run
# again resumes from its newest checkpoint and must end with those parameters too. Then the
# ckpt tool looks inside: the checkpoint tree, the latest checkpoint with per-tensor
# statistics, and a diff of the first two runs' final checkpoints, entry by entry.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh --demo  # not the test suite's (doctest, libtorch, MPI, the Python stack)
build=${CKPT_BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCKPT_BUILD_TESTS=OFF > /dev/null
cmake --build "$build" --target fault_recover ckpt-tool -j"$(nproc)"
export OPENBLAS_NUM_THREADS=1  # single-threaded BLAS, and no idle BLAS threads spinning
demo="$build/fault_recover_demo"
rm -rf "$demo"
mkdir -p "$demo"
program="$build/examples/fault_recover/fault_recover"
"$program" --dir "$demo/lenet" | tee "$demo/with_fault.log"
echo
echo "== the same training without the failure =="
"$program" --dir "$demo/lenet_no_fault" --no-fault --quiet | tee "$demo/no_fault.log" | grep -E "final test accuracy|final_params"
resumed=$(grep '^final_params_xxh64=' "$demo/with_fault.log")
straight=$(grep '^final_params_xxh64=' "$demo/no_fault.log")
if [ "$resumed" != "$straight" ]; then
    echo "MISMATCH: crash-and-resume $resumed, uninterrupted $straight" >&2
    exit 1
fi
echo "crash-and-resume and uninterrupted runs end bit-identical: $resumed"

echo
echo "== killed from outside (SIGKILL) in the middle of epoch 3, then the same command again =="
killed=("$program" --dir "$demo/lenet_killed" --no-fault --quiet --save-steps 625)
echo "\$ ${killed[*]} &"
"${killed[@]}" > "$demo/killed.log" 2>&1 &
pid=$!
deadline=$((SECONDS + 300))
until grep -q '^saved lenet-3_1250.ckpt' "$demo/killed.log"; do
    if ! kill -0 "$pid" 2> /dev/null || [ $SECONDS -ge $deadline ]; then
        cat "$demo/killed.log" >&2
        echo "the run ended, or did not save epoch 3's step 1250 within 300 s" >&2
        kill -9 "$pid" 2> /dev/null || true
        exit 1
    fi
    sleep 0.05
done
sleep 0.2  # some 80 steps on: the middle of epoch 3, between two saves
kill -9 "$pid"
status=0
{ wait "$pid"; } 2> /dev/null || status=$?
cat "$demo/killed.log"
echo "\$ kill -9 $pid    # the run died with status $status"
[ "$status" -eq 137 ] || { echo "expected status 137 (SIGKILL), got $status" >&2; exit 1; }
echo "\$ ${killed[*]}"
"${killed[@]}" > "$demo/rerun.log" 2>&1 || { cat "$demo/rerun.log" >&2; exit 1; }
grep -v '^saved ' "$demo/rerun.log"
grep -q '^resuming from .*: saved at epoch 3, step 1250 of 1875' "$demo/rerun.log" ||
    { echo "the second run did not resume from epoch 3, step 1250" >&2; exit 1; }
rerun=$(grep '^final_params_xxh64=' "$demo/rerun.log")
if [ "$rerun" != "$straight" ]; then
    echo "MISMATCH: killed-and-resumed $rerun, uninterrupted $straight" >&2
    exit 1
fi
echo "killed-and-resumed and uninterrupted runs end bit-identical: $rerun"
tool="$build/ckpt"
echo
echo "== ckpt ls $demo =="
"$tool" ls "$demo"
latest=$(ls "$demo"/lenet/lenet_1-10_*.ckpt)
echo
echo "== ckpt show --stats $latest =="
"$tool" show --stats "$latest"
echo
echo "== ckpt diff: the final checkpoints of the crash-and-resume and the uninterrupted run =="
"$tool" diff "$latest" "$(ls "$demo"/lenet_no_fault/lenet-10_*.ckpt)"
