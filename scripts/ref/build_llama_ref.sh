#!/usr/bin/env bash
# Builds llama.cpp, with its CPU backend, from the pinned llama-cpp-python sdist: the reference for
# akunu's tokenizer and for its CPU inference engine.
#   OUTDIR/llama-tokenize     llama.cpp's own command-line tokenizer
#   OUTDIR/llama-perplexity   its perplexity tool
#   OUTDIR/llama-bench        its benchmark (scripts/bench/cpu.sh compares against it)
#   OUTDIR/tok_ref            scripts/ref/tok_ref.cpp, the tokenizer driven through llama.h
#   OUTDIR/lm_ref             scripts/ref/lm_ref.cpp, logits and greedy decoding through llama.h
#   OUTDIR/build/bin/         the shared libraries all of them load (found through their rpath)
#
#   scripts/ref/build_llama_ref.sh OUTDIR
#
# The sdist is $AKUNU_LCP_SDIST if set, else the copy build_ggml_ref.sh downloaded next to OUTDIR
# (OUTDIR/../ggml/dl), else it is downloaded with pip into OUTDIR/dl. Needs gcc, g++ (with OpenMP)
# and Python 3 with pip. Python is $PYTHON, else the repository's .venv, else python3. cmake and
# ninja are taken from PATH, or installed with pip under OUTDIR/tools.
#
# The CPU backend is built as llama.cpp's own release builds and llama-bench use it by default:
# tuned for the build machine (GGML_NATIVE) and threaded with OpenMP (GGML_OPENMP, the default),
# except for AMX: on x86-64 CPUs that have it (Sapphire Rapids and later) -march=native would
# compile ggml's AMX matrix products, which repack the weights at load and crash on the tiny
# engine models' Q4_K matrices (ggml-org/llama.cpp#20824), so the reference takes the AVX-512
# path there. Only the targets above are built, not the rest of the tools.
#
# Idempotent: llama.cpp is rebuilt only when the pinned version, its flags or the machine's CPU
# features change (a native build may not run on another CPU, and a cached OUTDIR can move between
# machines); tok_ref and lm_ref only when their source or the library changes.
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi

LCP_VERSION=0.3.36
CMAKE_FLAGS=(
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON
    -DGGML_CPU=ON -DGGML_NATIVE=ON -DGGML_OPENMP=ON -DGGML_CCACHE=OFF -DGGML_BACKEND_DL=OFF
    -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF
    -DLLAMA_OPENSSL=OFF -DLLAMA_LLGUIDANCE=OFF
)
if [ "$(uname -m)" = x86_64 ]; then
    NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    CMAKE_FLAGS+=("-DCMAKE_C_FLAGS=$NO_AMX" "-DCMAKE_CXX_FLAGS=$NO_AMX")
fi
TARGETS=(llama-tokenize llama-perplexity llama-bench)
# What -march=native resolves to: the CPU's model name and feature flags.
CPU_SIG=$( (grep -m1 '^model name' /proc/cpuinfo; grep -m1 -E '^(flags|Features)' /proc/cpuinfo) 2>/dev/null |
    sha256sum | cut -c1-16)
STAMP="llama-cpp-python==$LCP_VERSION ${CMAKE_FLAGS[*]} targets=${TARGETS[*]} cpu=$CPU_SIG"

mkdir -p "$1"
OUT=$(cd "$1" && pwd)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)

for tool in gcc g++; do
    command -v "$tool" >/dev/null || { echo "$tool is required" >&2; exit 1; }
done

. "$(dirname "$0")/common.sh"
PY=$(pick_python "$ROOT")

llama_ok() {
    local t
    for t in "${TARGETS[@]}"; do
        [ -x "$OUT/$t" ] || return 1
    done
    [ -f "$OUT/build/bin/libllama.so" ] && [ "$(cat "$OUT/STAMP" 2>/dev/null)" = "$STAMP" ]
}

if llama_ok; then
    echo "llama.cpp in $OUT is up to date ($STAMP)"
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

    rm -rf "$OUT/src" "$OUT/build" "$OUT/STAMP"
    for t in "${TARGETS[@]}"; do
        rm -f "$OUT/$t"
    done
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
    started=$SECONDS
    if ! (export GIT_CEILING_DIRECTORIES=$OUT
          "$CMAKE" -S "$OUT/src" -B "$OUT/build" -G Ninja -DCMAKE_MAKE_PROGRAM="$NINJA" \
              "${CMAKE_FLAGS[@]}" &&
              "$CMAKE" --build "$OUT/build" --target "${TARGETS[@]}") >"$OUT/cmake.log" 2>&1; then
        tail -n 40 "$OUT/cmake.log" >&2
        echo "llama.cpp build failed; the full log is $OUT/cmake.log" >&2
        exit 1
    fi

    # The build tree stays: its binaries find their libraries there through the build rpath.
    for t in "${TARGETS[@]}"; do
        ln -sf "build/bin/$t" "$OUT/$t"
    done
    echo "$STAMP" >"$OUT/STAMP"
    echo "built llama.cpp in $OUT in $((SECONDS - started)) s ($STAMP)"
fi

# Harnesses over llama.h, each rebuilt when its source or the library changes.
build_harness() {
    local name=$1 src=$ROOT/scripts/ref/$1.cpp stamp
    stamp=$(cat "$src" "$OUT/STAMP" | sha256sum | cut -d' ' -f1)
    if [ -x "$OUT/$name" ] && [ "$(cat "$OUT/${name^^}_STAMP" 2>/dev/null)" = "$stamp" ]; then
        echo "$OUT/$name is up to date"
        return
    fi
    g++ -std=c++17 -O2 -Wall -Wextra -o "$OUT/$name.tmp" "$src" \
        -I"$OUT/src/include" -I"$OUT/src/ggml/include" \
        -L"$OUT/build/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$OUT/build/bin"
    mv "$OUT/$name.tmp" "$OUT/$name"
    echo "$stamp" >"$OUT/${name^^}_STAMP"
    echo "built $OUT/$name"
}
build_harness tok_ref
build_harness lm_ref
