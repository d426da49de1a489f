#!/usr/bin/env bash
# Installs the Debian packages the build needs, and only those missing: when everything is
# there it does nothing and prints nothing.
#   deps.sh [package ...]    (default: what building and testing ckpt needs)
#   deps.sh --demo           what scripts/demo.sh builds and runs: the core, the training
#                            layer on OpenBLAS and Fashion-MNIST, and the ckpt tool
set -euo pipefail
packages=("$@")
if [ "${1:-}" = "--demo" ]; then
    packages=(g++ cmake make libboost-serialization-dev libboost-filesystem-dev xtensor-dev libxxhash-dev
              libopenblas-dev zlib1g-dev dataset-fashion-mnist nlohmann-json3-dev libzip-dev libcli11-dev
              libzstd-dev libssl-dev)
elif [ ${#packages[@]} -eq 0 ]; then
    packages=(g++ cmake make libboost-serialization-dev libboost-filesystem-dev xtensor-dev doctest-dev
              libxxhash-dev libopenblas-dev zlib1g-dev dataset-fashion-mnist ccache libgloo-dev redis-server
              nlohmann-json3-dev libzip-dev libcli11-dev python3-numpy libzstd-dev libssl-dev libtorch-dev python3-torch
              gnuplot-nox python3-xxhash python3-zstandard python3-cryptography python3-pytest python3-hypothesis
              python3-setuptools python3-wheel python3-venv libeigen3-dev libopenmpi-dev openmpi-bin pkg-config dpkg-dev
              mkdocs mkdocs-material doxygen)
fi
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "missing packages: ${missing[*]}" >&2
    echo "install them as root: apt-get install ${missing[*]}" >&2
    exit 1
fi
echo "installing: ${missing[*]}"
apt-get update -q
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
