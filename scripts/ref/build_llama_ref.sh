#!/usr/bin/env bash
# Builds llama.cpp's tokenizer reference from the pinned llama-cpp-python sdist:
#   OUTDIR/llama-tokenize    llama.cpp's own command-line tokenizer
#   OUTDIR/tok_ref           scripts/ref/tok_ref.cpp, the same library driven through llama.h
#   OUTDIR/build/bin/        the shared libraries both load (found through their rpath)
#
#   scripts/ref/build_llama_ref.sh OUTDIR
#
# The sdist is $AKUNU_LCP_SDIST if set, else the copy build_ggml_ref.sh downloaded next to OUTDIR
# (OUTDIR/../ggml/dl), else it is downloaded with pip into OUTDIR/dl. Needs gcc, g++ and Python 3
# with pip. Python is $PYTHON, else the repository's .venv, else python3. cmake and ninja are taken
# from PATH, or installed with pip under OUTDIR/tools.
#
# Idempotent: llama.cpp is rebuilt only when the pinned version or its flags change, tok_ref only
# when tok_ref.cpp changes.
#
# Tokenizing only needs the vocabulary, so ggml's CPU backend is left out (GGML_CPU=OFF): models are
# loaded with vocab_only and no tensor is ever computed. That drops the slowest part of the build.
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi

LCP_VERSION=0.3.36
CMAKE_FLAGS=(
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON
    -DGGML_CPU=OFF -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DGGML_CCACHE=OFF -DGGML_BACKEND_DL=OFF
    -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF
    -DLLAMA_OPENSSL=OFF -DLLAMA_LLGUIDANCE=OFF
)
STAMP="llama-cpp-python==$LCP_VERSION ${CMAKE_FLAGS[*]}"

mkdir -p "$1"
OUT=$(cd "$1" && pwd)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SRC_CPP=$ROOT/scripts/ref/tok_ref.cpp

for tool in gcc g++; do
    command -v "$tool" >/dev/null || { echo "$tool is required" >&2; exit 1; }
done

. "$(dirname "$0")/common.sh"
PY=$(pick_python "$ROOT")

llama_ok() {
    [ -x "$OUT/llama-tokenize" ] && [ -f "$OUT/build/bin/libllama.so" ] &&
        [ "$(cat "$OUT/STAMP" 2>/dev/null)" = "$STAMP" ]
}

if llama_ok; then
    echo "$OUT/llama-tokenize is up to date ($STAMP)"
else
    SDIST_NAME=llama_cpp_python-$LCP_VERSION.tar.gz
    if [ -n "${AKUNU_LCP_SDIST:-}" ]; then
        SDIST=$AKUNU_LCP_SDIST
    elif [ -f "$OUT/../ggml/dl/$SDIST_NAME" ]; then
        SDIST=$OUT/../ggml/dl/$SDIST_NAME
    else
        SDIST=$OUT/dl/$SDIST_NAME
        if [ ! -f "$SDIST" ]; then
            # Only the named package comes as source; pip may take wheels for the build backend it
            # runs to read the sdist's metadata.
            "$PY" -m pip download --quiet --no-deps --no-binary llama-cpp-python \
                "llama-cpp-python==$LCP_VERSION" -d "$OUT/dl"
        fi
    fi
    [ -f "$SDIST" ] || { echo "missing $SDIST" >&2; exit 1; }

    rm -rf "$OUT/src" "$OUT/build" "$OUT/llama-tokenize" "$OUT/STAMP"
    mkdir -p "$OUT/src"
    # models/ (vocabulary test files) and docs/ are most of the tree and play no part in the build;
    # .git is a submodule link to a directory the sdist does not have.
    tar -xzf "$SDIST" -C "$OUT/src" --strip-components=3 \
        --exclude="llama_cpp_python-$LCP_VERSION/vendor/llama.cpp/models" \
        --exclude="llama_cpp_python-$LCP_VERSION/vendor/llama.cpp/docs" \
        --exclude="llama_cpp_python-$LCP_VERSION/vendor/llama.cpp/.git" \
        "llama_cpp_python-$LCP_VERSION/vendor/llama.cpp"

    find_build_tools "$OUT" "$PY"

    # The build asks git for a version string; a ceiling keeps it from finding the repository that
    # OUTDIR happens to sit in. Its complaints go to the log with the rest.
    if ! (export GIT_CEILING_DIRECTORIES=$OUT
          "$CMAKE" -S "$OUT/src" -B "$OUT/build" -G Ninja -DCMAKE_MAKE_PROGRAM="$NINJA" \
              "${CMAKE_FLAGS[@]}" &&
              "$CMAKE" --build "$OUT/build" --target llama-tokenize) >"$OUT/cmake.log" 2>&1; then
        tail -n 40 "$OUT/cmake.log" >&2
        echo "llama.cpp build failed; the full log is $OUT/cmake.log" >&2
        exit 1
    fi

    # The build tree stays: its binaries find their libraries there through the build rpath.
    ln -sf build/bin/llama-tokenize "$OUT/llama-tokenize"
    echo "$STAMP" >"$OUT/STAMP"
    rm -f "$OUT/TOK_REF_STAMP"
    echo "built $OUT/llama-tokenize ($STAMP)"
fi

TOK_STAMP=$(cat "$SRC_CPP" "$OUT/STAMP" | sha256sum | cut -d' ' -f1)
if [ -x "$OUT/tok_ref" ] && [ "$(cat "$OUT/TOK_REF_STAMP" 2>/dev/null)" = "$TOK_STAMP" ]; then
    echo "$OUT/tok_ref is up to date"
    exit 0
fi
g++ -std=c++17 -O2 -Wall -Wextra -o "$OUT/tok_ref.tmp" "$SRC_CPP" \
    -I"$OUT/src/include" -I"$OUT/src/ggml/include" \
    -L"$OUT/build/bin" -lllama -Wl,-rpath,"$OUT/build/bin"
mv "$OUT/tok_ref.tmp" "$OUT/tok_ref"
echo "$TOK_STAMP" >"$OUT/TOK_REF_STAMP"
echo "built $OUT/tok_ref"
