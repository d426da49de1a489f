#!/usr/bin/env bash
# Builds everything, runs the whole test suite, runs it again under the sanitizers
# (scripts/sanitize.sh: the unit suite under AddressSanitizer + UndefinedBehaviorSanitizer,
# the threaded parts under ThreadSanitizer), then fuzzes the checkpoint reader for a minute.
# Installs missing Debian packages first.
#   CKPT_SANITIZE=0      skips the sanitizer passes (asan or tsan: only that one)
#   CKPT_FUZZ_SECONDS=0  skips fuzzing
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
# ccache keeps its cache under $HOME; give it a place when there is no home.
[ -n "${HOME:-}" ] || export CCACHE_DIR=${CCACHE_DIR:-/var/tmp/ckpt-ccache}
build=${CKPT_BUILD_DIR:-build}
generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
if [ ! -f "$build/CMakeCache.txt" ]; then
    cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release
else
    cmake -S . -B "$build" > /dev/null
fi
sanitize=${CKPT_SANITIZE:-all}
[ "$sanitize" = 1 ] && sanitize=all
# The first sanitizer build compiles at the lowest priority from now on: on the CPU time the
# main build leaves idle at its end (one long compile, links) and the tests leave idle
# (processes starting, waits on each other).
first=$sanitize
[ "$first" = all ] && first=asan
sanitizer_build=
# In a process group of its own (job control on while it starts), so that a failure here
# stops all of it; not in a session of its own (setsid): the kernel's autogroups would then
# share the CPU between the two sessions equally, whatever the nice value.
trap '[ -z "$sanitizer_build" ] || kill -- -"$sanitizer_build" 2> /dev/null || true' EXIT
if [ "$sanitize" != 0 ]; then
    set -m
    nice -n 19 bash scripts/sanitize.sh "$first" --build-only > "$build/sanitizer-build.log" 2>&1 &
    sanitizer_build=$!
    set +m
fi
cmake --build "$build" -j"$(nproc)"
status=0
ctest --test-dir "$build" --output-on-failure -j"$(nproc)" || status=$?
if [ -n "$sanitizer_build" ]; then
    wait "$sanitizer_build" || { cat "$build/sanitizer-build.log" >&2; exit 1; }
    sanitizer_build=
fi
[ "$status" -eq 0 ] || exit "$status"
[ "$sanitize" = 0 ] || bash scripts/sanitize.sh "$sanitize"
# The checkpoint reader under libFuzzer for a bounded time (CKPT_FUZZ_SECONDS, 0 to skip).
fuzz_seconds=${CKPT_FUZZ_SECONDS:-60}
[ "$fuzz_seconds" -gt 0 ] && bash scripts/fuzz.sh "$fuzz_seconds"
exit 0
