#!/usr/bin/env bash
# Encoding speed of akunu's tokenizer against llama.cpp's, same vocabulary and text, one run.
#
#   scripts/bench/tokenizer.sh [ITERS]
#
# Needs the reference data of scripts/test.sh ($AKUNU_REFDATA, default .refdata): the
# llama.cpp harness (tok_ref, libllama from the pinned sdist), the vocabulary-only GGUF files,
# the prose corpus, and the default model for Gemma 3 ($AKUNU_MODEL, else `akunu pull`). Both
# sides time only the encode call, with special tokens parsed and BOS added as the vocabulary
# asks; the two are interleaved per vocabulary so that machine noise hits both. Prints a table.
set -euo pipefail
cd "$(dirname "$0")/../.."
iters=${1:-20}
refdata=${AKUNU_REFDATA:-$PWD/.refdata}
tok_ref=$refdata/llama/tok_ref
text=$refdata/tok/corpus/prose.txt
[ -x "$tok_ref" ] && [ -f "$text" ] || { echo "run scripts/test.sh first (needs $tok_ref and $text)" >&2; exit 1; }
cargo build --release --quiet -p akunu-cli
bench=$(cargo bench -p akunu-tokenizer --bench encode --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m["target"]["name"]=="encode" and m.get("executable"): print(m["executable"])')
model=${AKUNU_MODEL:-$(target/release/akunu pull -q)}

field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }
printf '%-8s %8s %9s %14s %14s %7s\n' vocab bytes tokens "llama.cpp ms" "akunu ms" speedup
for v in gemma3 llama3 qwen3 bert; do
  m=$refdata/tok/$v.gguf
  [ "$v" = gemma3 ] && m=$model
  ref=$("$tok_ref" bench "$m" "$text" "$iters")
  ours=$("$bench" "$m" "$text" "$iters")
  [ "$(field "$ref" tokens)" = "$(field "$ours" tokens)" ] || { echo "$v: token counts differ" >&2; exit 1; }
  r=$(field "$ref" median_ms); o=$(field "$ours" median_ms)
  printf '%-8s %8s %9s %14.2f %14.2f %6.1fx\n' "$v" "$(field "$ours" bytes)" "$(field "$ours" tokens)" "$r" "$o" \
    "$(python3 -c "print($r/$o)")"
done
