#!/usr/bin/env bash
# The .deb CPack builds from the install rules: it holds the headers, the compiled library,
# the tools and the CMake and pkg-config files, says what it depends on, and a consumer builds
# and runs against it unpacked into a scratch root (find_package with a component, and
# pkg-config).
#   check_deb.sh <build dir> <source dir> <c++ compiler> <work dir>
set -euo pipefail
build=$1 source=$2 cxx=$3 work=$4
rm -rf "$work"
mkdir -p "$work"
(cd "$build" && cpack -G DEB -B "$work/out" > "$work/cpack.log") || { cat "$work/cpack.log" >&2; exit 1; }
deb=$(ls "$work"/out/ckpt_*.deb)
echo "built $(basename "$deb") ($(stat -c %s "$deb") bytes)"
dpkg-deb -f "$deb" Package Version Depends | sed 's/^/  /'
dpkg-deb -f "$deb" Depends | grep -q 'libboost-serialization-dev' || { echo "Depends lacks Boost" >&2; exit 1; }
dpkg-deb -x "$deb" "$work/root"
root=$work/root/usr
for f in include/ckpt/ckpt.hpp include/fault/fault.hpp include/nn/nn.hpp bin/ckpt bin/ckpt-run share/pkgconfig/ckpt.pc; do
    [ -e "$root/$f" ] || { echo "the package lacks usr/$f" >&2; exit 1; }
done
# lib/ or lib/<multiarch>/, as GNUInstallDirs chose for the build's prefix
[ -n "$(find "$root"/lib* -path '*/cmake/ckpt/ckptConfig.cmake')" ] ||
    { echo "the package lacks ckptConfig.cmake" >&2; exit 1; }
[ -n "$(find "$root"/lib* -name libckpt_compiled.a)" ] ||
    { echo "the package lacks libckpt_compiled.a" >&2; exit 1; }
"$root/bin/ckpt" --help > /dev/null
# a consumer: find_package with a component, against the unpacked root only
cmake -S "$source/tests/consume_core" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$root" -DCMAKE_CXX_COMPILER="$cxx" \
    -DCKPT_COMPONENT=interop > "$work/consumer.log" || { cat "$work/consumer.log" >&2; exit 1; }
grep -q "$work/root" "$work/consumer/CMakeCache.txt" || { echo "the consumer did not find the unpacked package" >&2; exit 1; }
# and pkg-config: a program of the core, compiled and run
PKG_CONFIG_PATH=$root/share/pkgconfig
export PKG_CONFIG_PATH
"$cxx" -O0 -o "$work/consumer_pc" "$source/tests/consume/main.cpp" $(pkg-config --cflags --libs ckpt)
"$work/consumer_pc"
echo "the .deb installs a package that builds and runs a consumer"
