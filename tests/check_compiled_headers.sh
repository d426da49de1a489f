#!/bin/sh
# In compiled mode (CKPT_SEPARATE_COMPILATION) a file that includes <ckpt/ckpt.hpp> reads no
# Boost.Serialization header and none of include/ckpt/impl/: the library compiled them once.
# Header-only, it reads both (which shows the check can see them).
#   check_compiled_headers.sh <c++ compiler> <include dir>
set -eu
cxx=$1
include=$2
deps() { echo '#include <ckpt/ckpt.hpp>' | "$cxx" -std=c++20 "$@" -I"$include" -x c++ -M -; }
pattern='boost/archive/|boost/serialization/|ckpt/impl/checkpoint\.ipp'
if ! deps | grep -Eq "$pattern"; then
    echo "header-only mode should read Boost.Serialization's headers and impl/checkpoint.ipp; the check sees none" >&2
    exit 1
fi
if found=$(deps -DCKPT_SEPARATE_COMPILATION | tr ' ' '\n' | grep -E "$pattern"); then
    echo "compiled mode still reads:" >&2
    echo "$found" >&2
    exit 1
fi
echo "compiled mode: no Boost.Serialization header, no definitions of the compiled library"
