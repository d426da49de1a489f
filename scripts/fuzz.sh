#!/usr/bin/env bash
# Fuzzes the readers (checkpoints, their zstd and aes-256-gcm body codecs included; safetensors,
# npz and PyTorch files from ckpt/interop.hpp, loaded and listed) with libFuzzer (Debian
# clang-14), AddressSanitizer and UndefinedBehaviorSanitizer, for a bounded time, from a seed
# corpus of real files and of the hostile corpus (tests/hostile); one target, whose input's
# first byte picks the reader (fuzz/reader_input.hpp), so that every reader shares the time.
# Inputs are capped at 64 KiB and a single allocation at 64 MiB: reading a file must never
# need more memory than its size suggests. A crash is saved under build-fuzz/ and fails
# the run; put the input in tests/fuzz_regressions/ so the test suite replays it for good.
#   bash scripts/fuzz.sh [seconds]     (default 60: seconds of fuzzing on each core, in that
#                                      much time divided by the number of cores; libFuzzer's
#                                      fork mode runs one worker per core on a shared corpus;
#                                      an allocation over the limit and a timeout stop it, as
#                                      a crash does)
# CKPT_FUZZ_OUT names another build folder than build-fuzz (a long run beside the test tiers');
# CKPT_FUZZ_WORKERS another number of workers than one per core (a long run on one core,
# leaving the other to other work).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-60}
bash "$root/scripts/deps.sh" clang-14 libclang-rt-14-dev nlohmann-json3-dev libzip-dev libzstd-dev libssl-dev \
    python3-torch python3-numpy
out=${CKPT_FUZZ_OUT:-$root/build-fuzz}
mkdir -p "$out/corpus" "$out/crashes"
flags=(-std=c++20 -I"$root/include" -DNDEBUG)
libs=(-lboost_serialization -lboost_filesystem -lxxhash -lzip -lzstd -lcrypto)
# the two programs compile side by side
g++ -O1 "${flags[@]}" "$root/fuzz/make_seeds.cpp" -o "$out/make_seeds" "${libs[@]}" &
seeds=$!
clang++-14 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined "${flags[@]}" \
    "$root/fuzz/checkpoint_reader.cpp" -o "$out/checkpoint_reader" "${libs[@]}"
# PyTorch files for the seeds, written by torch.save (the test suite's own)
rm -rf "$out/torch-files" && mkdir -p "$out/torch-files"
/usr/bin/python3 "$root/tests/python/write_torch_files.py" "$out/torch-files" > "$out/torch-files.log" 2>&1 ||
    { cat "$out/torch-files.log" >&2; exit 1; }
wait "$seeds"
"$out/make_seeds" "$out/seeds" "$out/torch-files" "$root/tests/hostile"
workers=${CKPT_FUZZ_WORKERS:-$(nproc)}
wall=$(( (seconds + workers - 1) / workers ))
echo "fuzzing the readers: $workers workers for $wall s"
"$out/checkpoint_reader" "$out/corpus" "$out/seeds" "$root/tests/fuzz_regressions" -fork="$workers" -ignore_ooms=0 -ignore_timeouts=0 \
    -max_total_time="$wall" -max_len=65536 -malloc_limit_mb=64 -rss_limit_mb=2048 -timeout=10 \
    -artifact_prefix="$out/crashes/" -print_final_stats=1 2>&1 | tee "$out/fuzz.log" | grep -E "^(#[0-9]+.*(INITED|DONE|pulse|time:)|INFO: fuzzed|==|SUMMARY|stat::)" || true
if [ "${PIPESTATUS[0]}" -ne 0 ] || ls "$out/crashes" | grep -q .; then
    echo "the fuzzer found a failing input: $(ls "$out/crashes")" >&2
    tail -40 "$out/fuzz.log" >&2
    exit 1
fi
