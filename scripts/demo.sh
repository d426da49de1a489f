#!/usr/bin/env bash
# The main job: build the heat-diffusion solver, kill it with SIGKILL mid-run, restart it,
# and check that it ends bit-identical to an uninterrupted run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
build=${CKPT_BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$build" --target heat_diffusion -j"$(nproc)"
bash examples/heat_diffusion/kill_and_resume.sh "$build/examples/heat_diffusion/heat_diffusion" "$build/heat_demo"
