#!/usr/bin/env bash
# Regenerates single_include/{ckpt,nn,fault}/*.hpp from include/ckpt/, include/nn/ and
# include/fault/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
for entry in ckpt nn fault; do
    mkdir -p "$root/single_include/$entry"
    cmake -DROOT="$root" -DENTRY=$entry -DOUT="$root/single_include/$entry/$entry.hpp" -P "$root/tools/amalgamate.cmake"
done
