#!/usr/bin/env bash
# The tests, in two tiers. Installs missing Debian packages first.
#   bash scripts/test.sh         after every change: builds what the tests need (the library,
#                                tools, examples, test programs) and runs ctest
#   bash scripts/test.sh --all   what CI runs: the above, and the header checks (each public
#                                header compiles alone; the core's in both modes), the
#                                benchmarks at -O0, each run once on a small size with the
#                                checks of what it timed (scripts/bench_smoke.sh), the
#                                documentation site (scripts/docs.sh), the unit suite in compiled mode
#                                (ckpt::ckpt_compiled), the sanitizers (scripts/sanitize.sh:
#                                the unit suite under AddressSanitizer + UndefinedBehaviorSanitizer,
#                                the threaded parts under ThreadSanitizer) and a minute of fuzzing
#                                the checkpoint reader (scripts/fuzz.sh)
# With --all:
#   CKPT_SANITIZE=0      skips the sanitizer passes (asan or tsan: only that one)
#   CKPT_FUZZ_SECONDS=0  skips fuzzing
# CKPT_BUILD_DIR (default build) is the build directory.
set -euo pipefail
cd "$(dirname "$0")/.."
all=0
case "${1:-}" in
"") ;;
--all) all=1 ;;
*) echo "usage: $0 [--all]" >&2; exit 2 ;;
esac
started=$SECONDS
stage=$SECONDS
# says how long the stage that ends here took
took() { echo "scripts/test.sh: $1: $((SECONDS - stage)) s"; stage=$SECONDS; }
bash scripts/deps.sh
# ccache keeps its cache under $HOME; give it a place when there is no home.
[ -n "${HOME:-}" ] || export CCACHE_DIR=${CCACHE_DIR:-/var/tmp/ckpt-ccache}
build=${CKPT_BUILD_DIR:-build}
generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
compiled=OFF
[ "$all" = 1 ] && compiled=ON
if [ ! -f "$build/CMakeCache.txt" ]; then
    cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DCKPT_BUILD_TESTS=ON -DCKPT_TEST_COMPILED=$compiled
else
    cmake -S . -B "$build" -DCKPT_BUILD_TESTS=ON -DCKPT_TEST_COMPILED=$compiled > /dev/null
fi
jobs=$(nproc)
took "packages and configuration"

if [ "$all" = 0 ]; then
    cmake --build "$build" -j"$jobs"
    took build
    ctest --test-dir "$build" --output-on-failure -j"$jobs"
    took ctest
    echo "scripts/test.sh: passed in $((SECONDS - started)) s"
    exit 0
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
# The test programs first, so that ctest starts as soon as they are there; the header checks
# and the benchmarks, which no test runs, compile while it runs, at a lower priority than the
# tests and a higher one than the sanitizer build. The header checks only have to compile,
# at -O0; the benchmarks are built at -O0 (bench_checks) for the small runs that follow.
# `cmake --build build --target benches` builds the optimized programs the figures come from.
cmake --build "$build" -j"$jobs"
took "build (both modes)"
status=0
nice -n 10 cmake --build "$build" --target header_checks bench_checks -j1 > "$build/extra-build.log" 2>&1 &
extra_build=$!
ctest --test-dir "$build" --output-on-failure -j"$jobs" || status=$?
took "ctest (both modes)"
wait "$extra_build" || { cat "$build/extra-build.log" >&2; exit 1; }
took "rest of the header checks' and benchmarks' compile"
# Every benchmark once on a small size (the figures mean nothing there): each checks what it
# timed, so that one that stops measuring fails here rather than in docs/PERFORMANCE.md.
bash scripts/bench_smoke.sh "$build"
took "the benchmarks on small sizes"
# The documentation site, with the API reference from the headers: a broken link or a name
# the headers no longer declare fails (its examples ran in ctest).
bash scripts/docs.sh "$build" > "$build/docs.log" 2>&1 || { cat "$build/docs.log" >&2; exit 1; }
took "the documentation site (mkdocs build --strict)"
if [ -n "$sanitizer_build" ]; then
    wait "$sanitizer_build" || { cat "$build/sanitizer-build.log" >&2; exit 1; }
    sanitizer_build=
    took "rest of the first sanitizer build"
fi
[ "$status" -eq 0 ] || exit "$status"
[ "$sanitize" = 0 ] || bash scripts/sanitize.sh "$sanitize"
took sanitizers
# The checkpoint reader under libFuzzer for a bounded time (CKPT_FUZZ_SECONDS, 0 to skip).
fuzz_seconds=${CKPT_FUZZ_SECONDS:-60}
if [ "$fuzz_seconds" -gt 0 ]; then
    bash scripts/fuzz.sh "$fuzz_seconds"
    took "fuzzing (build and run)"
fi
echo "scripts/test.sh --all: passed in $((SECONDS - started)) s"
exit 0
