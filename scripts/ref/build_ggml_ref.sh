#!/usr/bin/env bash
# Builds ggml's base library (type traits, reference quantizers and dequantizers; no CPU backend)
# from the pinned llama-cpp-python sdist into OUTDIR/libggml-base.so.
#
#   scripts/ref/build_ggml_ref.sh OUTDIR
#
# Needs gcc and g++, Python 3 with pip. Python is $PYTHON, else the repository's .venv, else
# python3. cmake and ninja are taken from PATH, or installed with pip under OUTDIR/tools.
# Idempotent: a second run with the same pinned version and flags does nothing.
#
# The library is compiled with -ffp-contract=off so that no multiply-add is fused on targets with
# FMA in the base ISA (aarch64): the reference keeps ggml's plain C evaluation order everywhere.
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi

LCP_VERSION=0.3.36
CFLAGS_REF="-ffp-contract=off"
STAMP="llama-cpp-python==$LCP_VERSION $CFLAGS_REF"

mkdir -p "$1"
OUT=$(cd "$1" && pwd)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)

if [ -f "$OUT/libggml-base.so" ] && [ "$(cat "$OUT/STAMP" 2>/dev/null)" = "$STAMP" ]; then
    echo "$OUT/libggml-base.so is up to date ($STAMP)"
    exit 0
fi

. "$(dirname "$0")/common.sh"
PY=$(pick_python "$ROOT")

for tool in gcc g++; do
    command -v "$tool" >/dev/null || { echo "$tool is required" >&2; exit 1; }
done

SDIST="$OUT/dl/llama_cpp_python-$LCP_VERSION.tar.gz"
if [ ! -f "$SDIST" ]; then
    # Only the named package comes as source; pip may take wheels for the build backend it runs
    # to read the sdist's metadata.
    "$PY" -m pip download --quiet --no-deps --no-binary llama-cpp-python \
        "llama-cpp-python==$LCP_VERSION" -d "$OUT/dl"
fi

rm -rf "$OUT/src" "$OUT/build"
mkdir -p "$OUT/src"
tar -xzf "$SDIST" -C "$OUT/src" --strip-components=3 \
    "llama_cpp_python-$LCP_VERSION/vendor/llama.cpp/ggml"
# The sdist leaves out the pkg-config template that a standalone ggml configure insists on
# reading; it only matters for `install`, so an empty one will do.
touch "$OUT/src/ggml/ggml.pc.in"

find_build_tools "$OUT" "$PY"

"$CMAKE" -S "$OUT/src/ggml" -B "$OUT/build" -G Ninja -DCMAKE_MAKE_PROGRAM="$NINJA" \
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DCMAKE_C_FLAGS="$CFLAGS_REF" -DCMAKE_CXX_FLAGS="$CFLAGS_REF" \
    -DGGML_CPU=OFF -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DGGML_CCACHE=OFF \
    -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF >"$OUT/cmake.log"
"$CMAKE" --build "$OUT/build" --target ggml-base >>"$OUT/cmake.log"

cp -L "$(find "$OUT/build" -name 'libggml-base.so' | head -n 1)" "$OUT/libggml-base.so.tmp"
mv "$OUT/libggml-base.so.tmp" "$OUT/libggml-base.so"
echo "$STAMP" >"$OUT/STAMP"
echo "built $OUT/libggml-base.so ($STAMP)"
