#!/usr/bin/env bash
# Regenerates single_include/ckpt/ckpt.hpp from include/ckpt/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$root/single_include/ckpt"
cmake -DROOT="$root" -DOUT="$root/single_include/ckpt/ckpt.hpp" -P "$root/tools/amalgamate.cmake"
