#!/bin/sh
# make_goldens.sh BASE_KILN_BINARY [OUT]
#
# Regenerates tests/golden/goldens-2e00d3f.txt (or OUT) with the kiln binary of a Release
# build of the commit the goldens pin (2e00d3f), e.g.
#
#   tests/golden/make_goldens.sh /work/base/build/kiln
#
# golden_decode.c is compiled here against that build's shared library (BASE/src/libkiln.so,
# beside the binary) and the kiln.h of its source tree, so that the decode goldens, too, come
# from the old library. Needs a CPU with every SIMD path (scalar, AVX2, AVX-512 with VNNI),
# python3, cc, and the reference data (../shared, or $KILN_SHARED_DIR).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "usage: $0 BASE_KILN_BINARY [OUT]" >&2
    exit 2
fi
kiln=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
build=$(dirname "$kiln")
out=${2:-$here/goldens-2e00d3f.txt}
shared=${KILN_SHARED_DIR:-$root/../shared}
[ -x "$kiln" ] || { echo "$0: $kiln is not an executable" >&2; exit 2; }
[ -f "$build/src/libkiln.so" ] || { echo "$0: no $build/src/libkiln.so" >&2; exit 2; }
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")
btype=$(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$build/CMakeCache.txt")
cc_path=$(sed -n 's/^CMAKE_C_COMPILER:FILEPATH=//p' "$build/CMakeCache.txt")
commit=$(git -C "$src" rev-parse --short=7 HEAD 2>/dev/null || echo unknown)
dirty=$(git -C "$src" status --porcelain --untracked-files=no 2>/dev/null | head -1)
if [ "$commit" != 2e00d3f ] || [ -n "$dirty" ]; then
    echo "$0: warning: $src is at $commit${dirty:+ (modified)}, not 2e00d3f" >&2
fi
[ "$btype" = Release ] || echo "$0: warning: $build is a $btype build, not Release" >&2

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc -std=gnu17 -O2 -Wall -Wextra -I"$src/include" "$here/golden_decode.c" -o "$tmp/golden_decode" \
    "$build/src/libkiln.so" -Wl,-rpath,"$build/src"

python3 "$here/golden.py" make --kiln "$kiln" --decode "$tmp/golden_decode" --shared "$shared" \
    -o "$out" \
    --header "kiln bit-exact goldens: made by commit $commit ($btype build, $("$cc_path" --version | head -1))" \
    --header "regenerate: tests/golden/make_goldens.sh BASE_KILN_BINARY (here: $1)" \
    --header "cpu: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
