#!/usr/bin/env bash
# Regenerates single_include/ckpt/ckpt.hpp from include/ckpt/ and single_include/nn/nn.hpp
# from include/nn/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
for entry in ckpt nn; do
    mkdir -p "$root/single_include/$entry"
    cmake -DROOT="$root" -DENTRY=$entry -DOUT="$root/single_include/$entry/$entry.hpp" -P "$root/tools/amalgamate.cmake"
done
