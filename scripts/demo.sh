#!/usr/bin/env bash
# The main job: the seed's fault-recovery tutorial on Fashion-MNIST. LeNet5 trains for 10
# epochs with a checkpoint per epoch (keep 5), fails after epoch 6, finds the latest
# checkpoint, loads it and resumes to epoch 10. A second run that never fails must end
# with the same parameters, bit for bit. Then the ckpt tool looks inside: the checkpoint
# tree, the latest checkpoint with per-tensor statistics, and a diff of both runs' final
# checkpoints, entry by entry.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
build=${CKPT_BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release > /dev/null
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
