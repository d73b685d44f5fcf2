#!/usr/bin/env bash
# CPU inference speed of akunu against llama.cpp: prompt processing (pp128) and generation (tg64).
#
#   scripts/bench/cpu.sh [MODEL]
#
# Runs llama.cpp's llama-bench from the reference build ($AKUNU_REFDATA/llama, default
# .refdata/llama; scripts/ref/build_llama_ref.sh makes it) and `akunu bench`, which takes the same
# options and prints the same JSON, with one thread per physical core (override with
# AKUNU_BENCH_THREADS): extra SMT threads only slow both down. MODEL defaults to $AKUNU_MODEL, else
# the default model (`akunu pull`). Prints a markdown table: tokens per second of each, mean ± sd
# over 3 repetitions, and akunu's speed as a fraction of llama.cpp's. If akunu's bench fails or
# prints invalid JSON, the table is still printed with llama.cpp's numbers and the script exits
# non-zero. llama.cpp's OpenMP threads spin while they wait, so its numbers collapse when other
# work shares the cores: measure on an otherwise idle machine (or, on a shared one, compare with
# OMP_WAIT_POLICY=passive set, which llama-bench inherits). On CPUs with AMX the reference is
# built without it (build_llama_ref.sh says why): there llama.cpp's numbers are its AVX-512 path's.
set -euo pipefail
cd "$(dirname "$0")/../.."
refdata=${AKUNU_REFDATA:-$PWD/.refdata}
llama_bench=$refdata/llama/llama-bench
py=${AKUNU_PYTHON:-$PWD/.venv/bin/python}
[ -x "$llama_bench" ] || { echo "missing $llama_bench: run scripts/ref/build_llama_ref.sh $refdata/llama" >&2; exit 1; }
[ -x "$py" ] || { echo "missing $py: run scripts/test.sh once (it makes the venv)" >&2; exit 1; }

cargo build --release --quiet -p akunu-cli
akunu=${CARGO_TARGET_DIR:-$PWD/target}/release/akunu
model=${1:-${AKUNU_MODEL:-$("$akunu" pull -q)}}
# Physical cores: distinct (core, socket) pairs; nproc where lscpu cannot say.
cores=$(lscpu -p=Core,Socket 2>/dev/null | grep -v '^#' | sort -u | wc -l)
[ "$cores" -gt 0 ] || cores=$(nproc)
threads=${AKUNU_BENCH_THREADS:-$cores}
args=(-m "$model" -p 128 -n 64 -r 3 -t "$threads" -o json)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "llama-bench ${args[*]}" >&2
"$llama_bench" "${args[@]}" >"$tmp/llama.json" 2>"$tmp/llama.err" ||
    { cat "$tmp/llama.err" >&2; exit 1; }
echo "akunu bench ${args[*]}" >&2
akunu_ok=1
"$akunu" bench "${args[@]}" >"$tmp/akunu.json" 2>"$tmp/akunu.err" ||
    { akunu_ok=0; echo "akunu bench failed:" >&2; tail -n 20 "$tmp/akunu.err" >&2; }

"$py" - "$tmp/llama.json" "$tmp/akunu.json" "$model" "$threads" <<'PY'
import json, os, sys

def load(path, who):
    """llama-bench's JSON: test name (pp128, tg64) -> (mean, sd) tokens per second."""
    try:
        with open(path) as f:
            text = f.read()
        rows = json.loads(text) if text.strip() else []
    except ValueError as e:
        print(f"{who} printed invalid JSON ({e}); its output is ignored", file=sys.stderr)
        return None
    out = {}
    for r in rows:
        if r["n_gen"] == 0:
            name = f"pp{r['n_prompt']}"
        elif r["n_prompt"] == 0:
            name = f"tg{r['n_gen']}"
        else:
            name = f"pp{r['n_prompt']}+tg{r['n_gen']}"
        out[name] = (r["avg_ts"], r["stddev_ts"])
    return out

ref, ours = load(sys.argv[1], "llama-bench"), load(sys.argv[2], "akunu bench")
print(f"model `{os.path.basename(sys.argv[3])}`, {sys.argv[4]} threads\n")
print("| test | llama.cpp t/s | akunu t/s | akunu / llama.cpp |")
print("|---|---:|---:|---:|")
for name, (m, sd) in (ref or {}).items():
    if name in (ours or {}):
        om, osd = ours[name]
        print(f"| {name} | {m:.2f} ± {sd:.2f} | {om:.2f} ± {osd:.2f} | {om / m:.2f} |")
    else:
        print(f"| {name} | {m:.2f} ± {sd:.2f} | n/a | n/a |")
sys.exit(0 if ref is not None and ours is not None else 1)
PY
[ "$akunu_ok" = 1 ]
