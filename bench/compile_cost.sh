#!/usr/bin/env bash
# What including ckpt costs a file: compile seconds of two programs, header-only and compiled
# (CKPT_SEPARATE_COMPILATION, linking ckpt::ckpt_compiled), against the dependencies alone.
#   deps      Boost.Serialization's binary, text and xml archives, Boost.Filesystem and xtensor:
#             the headers the library is built on, with an empty main
#   smallest  the smallest manager program: a struct with state_dict(), restore, one on_step
#   using_it  the solver of the guide "A long job or simulation" (docs/guides/long-jobs.md,
#             "A solver that resumes"), taken from the page as it stands
# Every case is compiled the same number of times, in alternating order within each round,
# and its median is reported. The compiled cases are also linked and run, so that what is
# measured is a program that works.
#   bash bench/compile_cost.sh [rounds] [optimization...]     (default: 3 -O0 -O2)
# The library the compiled cases link against is compiled at the last level given (-O2 by
# default; `1 -O0` is a quick run, its figures meaningless, its checks applied), or is
# CKPT_COMPILED_LIBRARY when set: a build's libckpt_compiled.a (scripts/bench_smoke.sh), whose
# compile no figure depends on.
# Last line:
#   compile_cost header_only/deps=R1 compiled/deps=R2 (smallest, -O0)
# Exit status 1 if the run did not time what it planned: every case compiled `rounds` times,
# each writing its object file anew, none in less than 0.1 s (no file that includes Boost's
# archives compiles that fast: such a time is a cache's answer, e.g. CXX="ccache g++").
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rounds=${1:-3}
[ "$rounds" -ge 1 ] || { echo "compile_cost: rounds must be at least 1" >&2; exit 2; }
shift || true
levels=("$@")
[ ${#levels[@]} -gt 0 ] || levels=(-O0 -O2)
cxx=${CXX:-g++}
work=$(mktemp -d /tmp/ckpt-compile-cost-XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"

cat > deps.cpp <<'EOF'
#include <boost/archive/binary_iarchive.hpp>
#include <boost/archive/binary_oarchive.hpp>
#include <boost/archive/text_iarchive.hpp>
#include <boost/archive/text_oarchive.hpp>
#include <boost/archive/xml_iarchive.hpp>
#include <boost/archive/xml_oarchive.hpp>
#include <boost/filesystem.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xtensor.hpp>
int main() {}
EOF
cat > smallest.cpp <<'EOF'
#include <ckpt/ckpt.hpp>

#include <cstdint>

struct State {
    std::int64_t step = 0;
    ckpt::ParamDict state_dict() {
        ckpt::ParamDict d;
        d.set("step", ckpt::view_of(step));
        return d;
    }
};

int main() {
    State s;
    ckpt::CheckpointManager<> mgr("checkpoints", "run");
    mgr.restore(s);
    for (; s.step < 10; ++s.step) mgr.on_step(ckpt::Progress::at_iteration(s.step + 1), s);
}
EOF
# The guide's first C++ block: its #include lines on top, the rest as main's body (the
# documentation's block test does the same).
guide="$root/docs/guides/long-jobs.md"
awk '/^## A solver that resumes/ {in_section = 1} in_section && /^```cpp$/ {in_block = 1; next}
     in_block && /^```$/ {exit} in_block {print}' "$guide" > block.txt
[ -s block.txt ] || { echo "compile_cost: no C++ block under '## A solver that resumes' in $guide" >&2; exit 1; }
{ grep '^#include' block.txt; echo 'int main() {'; grep -v '^#include' block.txt; echo '}'; } > using_it.cpp

libs=(-lboost_serialization -lboost_filesystem -lxxhash -lpthread)
echo "compile_cost: $cxx $($cxx -dumpversion), $(nproc) cores, $(date -u +%F)"
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN {printf "%.2f", b - a}'; }
start=$(date +%s.%N)
if [ -n "${CKPT_COMPILED_LIBRARY:-}" ]; then
    [ -f "$CKPT_COMPILED_LIBRARY" ] || { echo "compile_cost: CKPT_COMPILED_LIBRARY: no file $CKPT_COMPILED_LIBRARY" >&2; exit 2; }
    library=$CKPT_COMPILED_LIBRARY
    echo "the compiled library: $library"
else
    lib_level=${levels[${#levels[@]} - 1]}
    library=libckpt.o
    $cxx -std=c++20 "$lib_level" -DCKPT_SEPARATE_COMPILATION -I"$root/include" -c "$root/src/ckpt.cpp" -o "$library"
    echo "the compiled library (src/ckpt.cpp, $lib_level, once per build): $(elapsed "$start") s"
fi

# seconds <source> <flags...>: wall time of one compile to an object file, which must be new
seconds() {
    local src=$1 t0 t
    shift
    rm -f "${src%.cpp}.o"
    t0=$(date +%s.%N)
    $cxx -std=c++20 "$@" -I"$root/include" -c "$src" -o "${src%.cpp}.o"
    t=$(elapsed "$t0")
    [ -s "${src%.cpp}.o" ] || { echo "compile_cost: $src $*: no object file written" >&2; exit 1; }
    awk -v t="$t" 'BEGIN { exit !(t >= 0.1) }' ||
        { echo "compile_cost: implausible: $src $* compiled in $t s (under 0.1 s: not a compile)" >&2; exit 1; }
    echo "$t"
}
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }

summary=
for opt in "${levels[@]}"; do
    declare -A times=()
    cases=("deps" "smallest header" "smallest compiled" "using_it header" "using_it compiled")
    for ((r = 0; r < rounds; r++)); do
        # alternate the order from round to round
        order=("${cases[@]}")
        if ((r % 2)); then
            order=()
            for ((i = ${#cases[@]} - 1; i >= 0; i--)); do order+=("${cases[i]}"); done
        fi
        for c in "${order[@]}"; do
            read -r prog mode <<< "$c"
            flags=("$opt")
            [ "$mode" = compiled ] && flags+=(-DCKPT_SEPARATE_COMPILATION)
            t=$(seconds "$prog.cpp" "${flags[@]}")
            times[$c]+="$t "
        done
    done
    for c in "${cases[@]}"; do
        # shellcheck disable=SC2086
        n=$(set -- ${times[$c]}; echo $#)
        [ "$n" -eq "$rounds" ] || { echo "compile_cost: $opt $c: planned $rounds compiles, timed $n" >&2; exit 1; }
    done
    # the compiled programs link against the library and run
    for prog in smallest using_it; do
        $cxx -std=c++20 "$opt" -DCKPT_SEPARATE_COMPILATION -I"$root/include" "$prog.cpp" "$library" -o "$prog" "${libs[@]}"
        (mkdir -p "run-$prog" && cd "run-$prog" && "../$prog" > /dev/null 2>&1) ||
            { echo "compile_cost: $prog (compiled mode) failed when run" >&2; exit 1; }
    done
    # shellcheck disable=SC2086
    deps=$(median ${times[deps]})
    printf '%s  %-22s %6.2f s\n' "$opt" "deps alone" "$deps"
    for c in "smallest header" "smallest compiled" "using_it header" "using_it compiled"; do
        # shellcheck disable=SC2086
        m=$(median ${times[$c]})
        printf '%s  %-22s %6.2f s  %5.2fx deps\n' "$opt" "${c/ header/ header-only}" "$m" "$(ratio "$m" "$deps")"
        [ "$opt" = "-O0" ] && [ "$c" = "smallest header" ] && summary+=" header_only/deps=$(ratio "$m" "$deps")"
        [ "$opt" = "-O0" ] && [ "$c" = "smallest compiled" ] && summary+=" compiled/deps=$(ratio "$m" "$deps")"
    done
    unset times
done
[ -z "$summary" ] || echo "compile_cost$summary (smallest, -O0)"
