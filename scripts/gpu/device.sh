#!/usr/bin/env bash
# Runs on the GPU machine over the working tree and the carried .gpu/ (see build.sh): the GPU
# kernel tests, the whole-model checks against the CPU backend, compute-sanitizer,
# `akunu bench` beside llama.cpp on identical synthetic models, and our attention kernels beside
# PyTorch's (flash_bench.py). Logs go to $OUT; the last lines printed are the summary table.
#   GPU_STAGES="tests sanitize e2e profile chains batch bench sweep flash timeline ab agree sample gemv gemm ncu ncu-gemm ncu-decode" (default: tests sanitize e2e profile bench flash)   GPU_MODELS="qwen3-0.6b:q4_0 ..."
#   GPU_SWEEP="GEMV_WAVES=2 GEMV_NORM=4,GEMV_NORM_ALONE=0 kernels=base" (stage sweep: chip
#   config settings, one per word, NAME=VALUE pairs joined by commas, each timed against the
#   defaults; kernels=NAME: the kernel sources of .gpu/kNAME, see GPU_AB)
#   GPU_SWEEP_ROUNDS=2 GPU_SWEEP_ARGS="-p 0 -n 128 -r 3" (the `akunu bench` arguments)
#   GPU_SWEEP_MODELS="qwen3-0.6b:q4_0" (default: GPU_MODELS' list)
#   GPU_BATCH_SLOTS="1,4,8,16" (stage batch: sequences decoding together)
#   GPU_REAL_MODEL=/path/to/gemma-3-270m-q4_k_m.gguf (stage agree: that file's logits, greedy
#   tokens and perplexity on .gpu/ppl.txt, GPU against the CPU backend)
#   GPU_TESTS="test-flash test-backend" (default: every test executable)
#   GPU_SANITIZE_TESTS="test-matmul" GPU_SANITIZE_FILTER="gated_product" (test-name regex)
#   GPU_SANITIZE_JOBS=12 (sanitizer processes at once) GPU_SANITIZE_LIMIT=540 (seconds a test)
#   GPU_AB="base runs" GPU_AB_ROUNDS=2 (stage ab: the prefill rows of flash-bench on the built
#   kernels and on each .gpu/k<name> (build.sh's GPU_KERNEL_REVS), alternated, TFLOP/s)
#   GPU_FLASH_ROUNDS=3 (stage flash: our binary and PyTorch take turns that many times, each
#   cell the rounds' median and each ratio the median of the rounds' ratios)
#   GPU_AB_SHAPES=decode (stage ab: the decode rows instead, read flush, us; stage timeline:
#   only these rows' timelines, of the built kernels and of each GPU_AB variant)
#   GPU_AB_FLUSH=write (stage ab with decode rows: flash-bench's write flush instead)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LOGS=/tmp/gpu-logs; rm -rf $LOGS; mkdir -p $LOGS
G=$PWD/.gpu; B=$G/bin
stages=${GPU_STAGES:-tests sanitize e2e profile bench flash}
models=${GPU_MODELS:-qwen3-0.6b:q4_0 llama3.2-1b:q4_0 qwen3-4b:q4_k llama3.1-8b:q4_0 llama3.1-8b:q4_k}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export AKUNU_REQUIRE_GPU=1 AKUNU_KERNEL_CACHE=/tmp/akunu-kernels
export AKUNU_REFDATA=/tmp/refdata; mkdir -p $AKUNU_REFDATA/engine && ln -sfn "$G/tiny" $AKUNU_REFDATA/engine/tiny
summary=$OUT/summary.txt; : > "$summary"
row() { echo "$*" | tee -a "$summary"; }
# a / b to two decimals, "?" when either is missing.
ratio() { python3 -c "import sys; a,b=sys.argv[1:]; print(f'{float(a)/float(b):.2f}')" "$1" "$2" 2>/dev/null || echo "?"; }
# Chip config settings (NAME=VALUE pairs joined by commas) as the environment array `envs`;
# `kernels=NAME` runs the kernel sources in .gpu/kNAME (build.sh's GPU_KERNEL_REVS).
chip_envs() {
  envs=()
  for kv in ${1//,/ }; do
    case $kv in kernels=*) envs+=("AKUNU_KERNEL_DIR=$G/k${kv#kernels=}");; *) envs+=("AKUNU_CHIP_$kv");; esac
  done
}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$OUT/gpu.txt"
gpu=$(head -1 "$OUT/gpu.txt" | cut -d, -f1)

# Background: llama.cpp build and the synthetic models, while the tests run.
if [[ $stages == *bench* || $stages == *e2e* || $stages == *profile* || $stages == *chains* || $stages == *batch* || $stages == *sweep* || $stages == *ncu-decode* ]]; then
  [[ $stages == *bench* ]] && ( bash "$G/llamacpp-peer.sh" build "$G/llama.cpp.tar.xz" > "$LOGS/llamacpp-build.log" 2>&1 ) &
  peer_pid=$!
  ( mkdir -p /tmp/models; tar xJf "$G/llama.cpp.tar.xz" -C /tmp/models ./gguf-py 2>/dev/null
    for spec in $models; do p=${spec%%:*}; q=${spec##*:}
      [ -f /tmp/models/$p-$q.gguf ] || PYTHONPATH=/tmp/models/gguf-py python3 "$G/synth_gguf.py" $p $q /tmp/models/$p-$q.gguf
    done > "$LOGS/synth.log" 2>&1 ) &
  synth_pid=$!
fi

if [[ $stages == *tests* ]]; then
  for t in "$B"/test-*; do
    [[ $t == *test-nvrtc ]] && continue  # compiled in CI; slow here
    [[ -n ${GPU_TESTS:-} && " $GPU_TESTS " != *" $(basename "$t") "* ]] && continue
    n=$(basename "$t")
    if "$t" --test-threads 1 > "$LOGS/$n.log" 2>&1; then r=pass; else r=FAIL; fi
    row "test $n: $r ($(grep -E '^test result' "$LOGS/$n.log" | tail -1))"
  done
  # The same executables under other chip configs, side by side once the plain runs are done:
  # most of their time is the host's references, and the variants of test-matmul and
  # test-backend one after another outlast a call. GPU contexts of separate processes take
  # turns, so no variant's launches share SMs with another's. Rows in the order listed.
  variants=()
  variant() {  # log name, executable, row text, settings (NAME=VALUE, AKUNU_CHIP_ added), test filter...
    local log=$1 exe=$2 text=$3 settings=$4; shift 4
    [[ -z ${GPU_TESTS:-} || " $GPU_TESTS " == *" $exe "* ]] || return 0
    local envs; chip_envs "$settings"
    ( if env "${envs[@]}" "$B/$exe" "$@" --test-threads 1 > "$LOGS/$log.log" 2>&1; then echo pass; else echo FAIL; fi > "$LOGS/$log.rc" ) &
    variants+=("$!|$log|test $exe$text")
  }
  # The whole-model checks with the token's RoPE and KV store in a launch of their own, with
  # decode attention in blocks of 4 warps (8 by default, where they fit), and with the norms
  # apart from the products.
  variant test-backend-rope test-backend ", RoPE in a launch of its own" ROPE_IN_ATTENTION_FROM=100000
  variant test-backend-warps4 test-backend ", decode blocks of 4 warps" DECODE_WARPS=4
  variant test-backend-norms test-backend ", norms apart from the products" GEMV_NORM=0
  # Decode attention planned for every block that fits an SM, not one block per SM.
  variant test-flash-packed test-flash ", decode blocks packed as they fit" DECODE_SPREAD=0
  # The mma.sync prefill kernel, which Hopper runs only at head sizes without a wgmma one.
  variant test-flash-mma test-flash ", mma.sync prefill at every head size" WGMMA_ATTENTION=0
  # The wgmma prefill on two persistent blocks: each block takes many work items in turn, and at
  # head size 256 the tests' launches take 128-row tiles (64 on a block per SM).
  variant test-flash-2blocks test-flash ", wgmma prefill on 2 blocks" WGMMA_PREFILL_BLOCKS=2
  # The residual norm products on one block per row group and on clusters of up to 4; every o
  # product's form (input already quantized) releasing the next kernel before its wait, not
  # only the chip config's choice; the tests' small launches, which take whole SMs by default,
  # sharing them as large ones do.
  variant test-matmul-norm1 test-matmul " residual_norm, at most 1 blocks per group" GEMV_NORM=1 residual_norm
  variant test-matmul-norm4 test-matmul " residual_norm, at most 4 blocks per group" GEMV_NORM=4 residual_norm
  variant test-matmul-norm-release test-matmul " residual_norm, every o product released before its wait" GEMV_NORM_RELEASE=2 residual_norm
  variant test-matmul-norm-shared test-matmul " residual_norm, blocks sharing SMs" GEMV_NORM_ALONE=0 residual_norm
  for v in "${variants[@]}"; do
    IFS='|' read -r pid log text <<< "$v"
    wait "$pid"
    row "$text: $(cat "$LOGS/$log.rc" 2>/dev/null || echo FAIL)"
  done
fi

if [[ $stages == *sanitize* ]]; then
  # Every test of every executable (but test-nvrtc, which launches nothing) under memcheck and
  # racecheck, one process per test and tool, GPU_SANITIZE_JOBS at once (the whole suite one
  # after another outlasts a call). AKUNU_SANITIZE=1 shortens the longest tests (the sampler's
  # draws, the backend's sampled chains: tests/common/mod.rs, sanitizing).
  san=$LOGS/sanitize; mkdir -p "$san"; : > "$san/rc"
  for n in ${GPU_SANITIZE_TESTS:-$(cd "$B" && ls test-* | grep -vx test-nvrtc)}; do
    [ -x "$B/$n" ] || continue
    # Tests that only compile modules start no CUDA context, which the sanitizer reports as a
    # failure (exit 255).
    "$B/$n" --list 2>/dev/null | sed -n 's/: test$//p' | grep -E "${GPU_SANITIZE_FILTER:-.}" \
      | grep -vE 'compiles?$' \
      | grep -vxFf <("$B/$n" --list --ignored 2>/dev/null | sed -n 's/: test$//p') \
      | while read -r t; do echo "memcheck $n $t"; echo "racecheck $n $t"; done
  done | xargs -P "${GPU_SANITIZE_JOBS:-12}" -L 1 bash -c '
    AKUNU_SANITIZE=1 timeout '"${GPU_SANITIZE_LIMIT:-540}"' compute-sanitizer --tool "$0" --error-exitcode 9 \
      "'"$B"'/$1" --test-threads 1 --exact "$2" > "'"$san"'/$0-$1-$2.log" 2>&1
    echo "$? $0 $1 $2" >> "'"$san"'/rc"'
  for tool in memcheck racecheck; do
    for n in $(awk -v t=$tool '$2 == t {print $3}' "$san/rc" | sort -u); do
      bad=$(awk -v t=$tool -v n=$n '$2 == t && $3 == n && $1 != 0 {printf " %s (rc=%s)", $4, $1}' "$san/rc")
      row "compute-sanitizer $tool $n: $(awk -v t=$tool -v n=$n '$2 == t && $3 == n' "$san/rc" | wc -l) tests, $([ -z "$bad" ] && echo clean || echo "not clean:$bad")"
    done
  done
  # The wgmma prefill's hand-over between a block's work items (two blocks take them all).
  if [[ -x "$B/test-flash" && " ${GPU_SANITIZE_TESTS:-test-flash} " == *" test-flash "* ]]; then
    AKUNU_CHIP_WGMMA_PREFILL_BLOCKS=2 timeout 240 compute-sanitizer --tool racecheck --error-exitcode 9 "$B/test-flash" \
      --test-threads 1 prefill_every bf16_and kv_heads_sharing windows > "$LOGS/sanitize-racecheck-flash-2blocks.log" 2>&1
    rc=$?; row "compute-sanitizer racecheck test-flash prefill on 2 blocks: $([ $rc = 0 ] && echo clean || echo "rc=$rc $(grep -m1 -E 'RACECHECK SUMMARY' "$LOGS/sanitize-racecheck-flash-2blocks.log")")"
  fi
fi

if [[ $stages == *e2e* ]]; then
  wait $synth_pid
  if true; then
    small=$(for spec in $models; do case $spec in qwen3-0.6b*|llama3.2-1b*) echo -n "/tmp/models/${spec%%:*}-${spec##*:}.gguf:";; esac; done)
    AKUNU_GPU_MODELS=$small "$B/test-backend" --test-threads 1 > "$LOGS/e2e-synthetic.log" 2>&1
    row "e2e synthetic models vs CPU: $([ $? = 0 ] && echo pass || echo FAIL)"
  fi
fi
if [[ $stages == *agree* ]]; then
  m=${GPU_REAL_MODEL:?stage agree needs GPU_REAL_MODEL}
  AKUNU_GPU_MODELS=$m "$B/test-backend" --test-threads 1 --nocapture > "$LOGS/agree-test-backend.log" 2>&1
  rc=$?; row "e2e $(basename "$m") vs CPU: $([ $rc = 0 ] && echo pass || echo FAIL)"
  ppl() { "$B/akunu" perplexity -m "$m" -f "$G/ppl.txt" -c 512 --chunks 5 "$@" 2>/dev/null | grep -o 'PPL = [0-9.]*' | cut -d' ' -f3; }
  row "perplexity $(basename "$m") -c 512: CPU $(ppl --n-gpu-layers 0 -t 16), GPU $(ppl --device cuda), GPU -b 16 $(ppl --device cuda -b 16)"
fi
if [[ $stages == *profile* ]]; then
  wait $synth_pid
  for spec in $models; do
    m=/tmp/models/${spec%%:*}-${spec##*:}.gguf
    "$B/akunu" profile -m "$m" -p 512 -n 64 --device cuda > "$OUT/profile-${spec%%:*}-${spec##*:}.md" 2>&1 \
      || row "profile $spec: FAIL ($(tail -1 "$OUT/profile-${spec%%:*}-${spec##*:}.md"))"
  done
fi
if [[ $stages == *chains* ]]; then
  # Sampled decode (`akunu run`, the CLI's default sampler, 256 tokens past end-of-generation):
  # chains drawn on the device against the host loop, which a penalty window longer than the
  # device's forces (--repeat-last-n 5000 at no penalty: the same draws' rules); alternated.
  wait $synth_pid
  row ""
  row "| sampled decode, t/s | device chains | host loop | ratio |"
  row "|---|---|---|---|"
  for spec in $models; do
    m=/tmp/models/${spec%%:*}-${spec##*:}.gguf
    gen() {
      "$B/akunu" run -m "$m" -p "Tell me a story about the sea." -n 256 --ignore-eos --seed 1 \
        --device cuda "$@" 2>&1 > /dev/null | tee -a "$LOGS/chains.log" \
        | sed -n 's/.*generated: [0-9]* tokens in [0-9.]* ms, \([0-9.]*\) t\/s.*/\1/p'
    }
    gen > /dev/null
    d1=$(gen); h1=$(gen --repeat-last-n 5000); d2=$(gen); h2=$(gen --repeat-last-n 5000)
    row "| $spec | ${d1:-?}, ${d2:-?} | ${h1:-?}, ${h2:-?} | $(ratio "$d2" "$h2") |"
  done
fi
if [[ $stages == *bench* ]]; then
  wait $synth_pid $peer_pid
  # The roofline of decode: copy bandwidth (bytes read and written by a 1 GiB device-to-device
  # copy, best of 20) over the bytes a step reads, every weight once but the embedding matrix
  # where the output matrix is apart (a row of it).
  copy_bw=$(python3 -c '
import torch
x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
best = float("inf")
for _ in range(20):
    a.record(); y.copy_(x); b.record(); b.synchronize(); best = min(best, a.elapsed_time(b))
print(f"{2 * x.numel() / (best * 1e-3):.4g}")' 2>> "$LOGS/copy-bandwidth.log")
  step_bytes() {
    "$B/akunu" inspect "$1" --json 2>/dev/null | python3 -c '
import json, sys
t = {x["name"]: x["bytes"] for x in json.load(sys.stdin)["tensors"]}
print(sum(t.values()) - (t.get("token_embd.weight", 0) if "output.weight" in t else 0))'
  }
  row ""; row "GPU: $gpu, copy bandwidth ${copy_bw:-?} B/s"
  row "| model | akunu pp512 | llama.cpp pp512 | ratio | akunu tg128 | llama.cpp tg128 | ratio | akunu tg128 of copy bandwidth |"
  row "|---|---|---|---|---|---|---|---|"
  for spec in $models; do
    m=/tmp/models/${spec%%:*}-${spec##*:}.gguf
    "$B/akunu" bench -m "$m" -p 512 -n 128 -r 3 --device cuda -o md > "$LOGS/akunu-bench-$(basename $m).md" 2>"$LOGS/akunu-bench-$(basename $m).err"
    bash "$G/llamacpp-peer.sh" bench "$m" > "$LOGS/llamacpp-bench-$(basename $m).md" 2>&1
    a_pp=$(grep pp512 "$LOGS/akunu-bench-$(basename $m).md" | awk -F'|' '{print $(NF-1)}' | awk '{print $1}')
    a_tg=$(grep tg128 "$LOGS/akunu-bench-$(basename $m).md" | awk -F'|' '{print $(NF-1)}' | awk '{print $1}')
    l_pp=$(grep pp512 "$LOGS/llamacpp-bench-$(basename $m).md" | awk -F'|' '{print $(NF-1)}' | awk '{print $1}')
    l_tg=$(grep tg128 "$LOGS/llamacpp-bench-$(basename $m).md" | awk -F'|' '{print $(NF-1)}' | awk '{print $1}')
    roof=$(python3 -c "import sys; t, n, bw = map(float, sys.argv[1:]); print(f'{100 * t * n / bw:.1f} %')" \
      "$a_tg" "$(step_bytes "$m")" "$copy_bw" 2>/dev/null || echo "?")
    row "| ${spec} | ${a_pp:-?} | ${l_pp:-?} | $(ratio "$a_pp" "$l_pp") | ${a_tg:-?} | ${l_tg:-?} | $(ratio "$a_tg" "$l_tg") | $roof |"
  done
fi
if [[ $stages == *sweep* ]]; then
  # Chip config settings against the defaults, `akunu bench` one setting after another in each
  # round, so a drift of the GPU's clocks reaches every setting alike. Cells: t/s per round.
  wait $synth_pid
  sweep_args=${GPU_SWEEP_ARGS:--p 0 -n 128 -r 3}
  row ""; row "GPU: $gpu, \`akunu bench $sweep_args\`, t/s per round (${GPU_SWEEP_ROUNDS:-2} rounds)"
  row "| model | setting | t/s | against the defaults |"
  row "|---|---|---|---|"
  mean() { python3 -c "import sys; v=[float(x) for x in sys.argv[1].split(' / ')]; print(sum(v)/len(v))" "$1" 2>/dev/null; }
  for spec in ${GPU_SWEEP_MODELS:-$models}; do
    m=/tmp/models/${spec%%:*}-${spec##*:}.gguf
    declare -A got=()
    for round in $(seq "${GPU_SWEEP_ROUNDS:-2}"); do
      for setting in defaults ${GPU_SWEEP:-}; do
        chip_envs "${setting#defaults}"
        t=$(env "${envs[@]}" "$B/akunu" bench -m "$m" $sweep_args --device cuda -o md 2>> "$LOGS/sweep.err" \
          | grep -E '\| *(tg|pp)[0-9]+( @ d[0-9]+)? *\|' | tail -1 | awk -F'|' '{print $(NF-1)}' | awk '{print $1}')
        got[$setting]="${got[$setting]:+${got[$setting]} / }${t:-?}"
      done
    done
    for setting in defaults ${GPU_SWEEP:-}; do
      d=$(mean "${got[defaults]}"); s=$(mean "${got[$setting]}")
      rel=$(python3 -c "import sys; a,b=map(float,sys.argv[1:]); print(f'{100*(a/b-1):+.1f} %')" "$s" "$d" 2>/dev/null || echo "?")
      row "| $spec | $setting | ${got[$setting]} | $rel |"
    done
    unset got
  done
fi
if [[ $stages == *flash* ]]; then
  # Background builds would slow the host side of the short decode runs.
  wait
  row ""
  # Every row with L2 left dirty by the flush (BENCHMARKS.md's method), then decode with it
  # left clean, as an engine decode step finds it.
  for args in "" "--shapes decode --flush read"; do
    python3 scripts/gpu/flash_bench.py --ours "$B/flash-bench" $args --rounds "${GPU_FLASH_ROUNDS:-1}" \
      2>> "$LOGS/flash-bench.log" \
      | while IFS= read -r line; do row "$line"; done
    rc=${PIPESTATUS[0]}
    [ "$rc" = 0 ] || row "flash bench $args: FAIL ($(tail -1 "$LOGS/flash-bench.log"))"
  done
fi
if [[ $stages == *timeline* ]]; then
  # Where the wgmma prefill and decode kernels' time goes: each row once on a timeline build
  # (flash-bench --timeline; decode after a read flush), summarised by flash_timeline.py into
  # timeline.md (timeline-<variant>.md for GPU_AB's kernels).
  wait
  for v in built ${GPU_AB:-}; do
    [ "$v" = built ] && kdir=() || kdir=(AKUNU_KERNEL_DIR="$G/k$v")
    name=$([ "$v" = built ] && echo timeline || echo "timeline-$v")
    env "${kdir[@]}" "$B/flash-bench" --shapes "${GPU_AB_SHAPES:-prefill,decode}" --flush read --iters 5 \
      --timeline "$LOGS/$name" > "$LOGS/$name-bench.log" 2>&1
    rc=$?
    python3 scripts/gpu/flash_timeline.py "$LOGS/$name"/*.timeline > "$OUT/$name.md" 2>&1
    row "timelines ($v): $([ $rc = 0 ] && echo "in $name.md" || echo "FAIL ($(tail -1 "$LOGS/$name-bench.log"))")"
  done
fi
if [[ $stages == *ab* ]]; then
  # Kernel sources against each other on the prefill rows, one after another in each round, so
  # a drift of the clocks reaches every variant alike.
  wait
  ab_shapes=${GPU_AB_SHAPES:-prefill}
  [ "$ab_shapes" = decode ] && ab_args=(--flush "${GPU_AB_FLUSH:-read}" --iters 100) ab_key=us || ab_args=(--iters 10) ab_key=tflops
  ab_row() {  # name, then the environment for flash-bench
    local name=$1; shift
    local cells
    cells=$(env "$@" "$B/flash-bench" --shapes "$ab_shapes" "${ab_args[@]}" --warmup 3 2>> "$LOGS/ab.err" | python3 -c '
import json, sys
print(" | ".join(str(json.loads(l).get(sys.argv[1], "error")) for l in sys.stdin if l.startswith("{")))' "$ab_key")
    row "| $name | ${cells:-failed} |"
  }
  row ""; row "GPU: $gpu, flash-bench --shapes $ab_shapes ${ab_args[*]}, $ab_key by row (in SHAPES order)"
  for round in $(seq "${GPU_AB_ROUNDS:-2}"); do
    ab_row built
    for v in ${GPU_AB:-}; do ab_row "$v" AKUNU_KERNEL_DIR="$G/k$v"; done
  done
fi
if [[ $stages == *batch* ]]; then
  # Continuous batching's decode: tokens drawn on the device after each pass against drawn by
  # the host from the logits read back (benches/batch.rs), alternated.
  wait $synth_pid
  for spec in $models; do
    m=/tmp/models/${spec%%:*}-${spec##*:}.gguf
    row ""
    if "$B/bench-batch" "$m" ${GPU_BATCH_SLOTS:+--slots $GPU_BATCH_SLOTS} > "$LOGS/bench-batch.log" 2>&1; then
      while IFS= read -r line; do row "$line"; done < "$LOGS/bench-batch.log"
    else
      row "bench-batch $spec: FAIL ($(tail -1 "$LOGS/bench-batch.log"))"
    fi
  done
fi
if [[ $stages == *sample* ]]; then
  # The sampler's time per launch (benches/sampler.rs).
  wait
  row ""
  if "$B/bench-sampler" > "$LOGS/bench-sampler.log" 2>&1; then
    while IFS= read -r line; do row "$line"; done < "$LOGS/bench-sampler.log"
  else
    row "bench-sampler: FAIL ($(tail -1 "$LOGS/bench-sampler.log"))"
  fi
fi
if [[ $stages == *gemv* ]]; then
  # Decode-sized products, the chip config's launch shapes beside unsplit rows and 8-warp blocks.
  "$B/test-matmul" --ignored --nocapture --exact gemv_bandwidth > "$OUT/gemv-bandwidth.txt" 2>&1
  row "gemv bandwidth: rc=$? ($(grep -c GB/s "$OUT/gemv-bandwidth.txt") lines)"
fi
if [[ " $stages " == *" gemm "* ]]; then
  # Prefill-sized products (512 tokens, the 8B's shapes) per weight type and tile size.
  "$B/test-gemm" --ignored --nocapture --exact gemm_throughput > "$OUT/gemm-throughput.txt" 2>&1
  row "gemm throughput: rc=$? ($(grep -c TF/s "$OUT/gemm-throughput.txt") lines)"
fi
if [[ " $stages " == *" ncu-decode "* ]]; then
  # The kernels of a few decode steps of `akunu bench` (empty context; NCU_SKIP / NCU_COUNT
  # launches), timed one at a time by Nsight Compute (boost clocks, warm caches unless
  # NCU_CONTROL says otherwise) and summed by name per step.
  wait $synth_pid
  for spec in $models; do
    m=/tmp/models/${spec%%:*}-${spec##*:}.gguf
    ncu --metrics gpu__time_duration.sum --csv ${NCU_CONTROL:---clock-control none --cache-control none} --launch-skip ${NCU_SKIP:-3000} --launch-count ${NCU_COUNT:-800} \
      "$B/akunu" bench -m "$m" -p 0 -n 128 -r 1 --no-warmup --device cuda 2> "$LOGS/ncu-decode-${spec%%:*}.err" \
      | python3 scripts/gpu/ncu_table.py embed > "$OUT/ncu-decode-${spec%%:*}-${spec##*:}.md" 2>&1
    row "ncu decode $spec: $(tail -1 "$OUT/ncu-decode-${spec%%:*}-${spec##*:}.md")"
  done
fi
if [[ " $stages " == *" ncu-gemm "* ]]; then
  # Nsight Compute on one GEMM launch of gemm_throughput: by default Q4_K 14336x4096, Auto tile.
  ncu --kernel-name regex:gemm_m --launch-skip ${NCU_SKIP:-714} --launch-count 1 ${NCU_ARGS:---set full} \
    "$B/test-gemm" --ignored --exact gemm_throughput > "$OUT/ncu-gemm.txt" 2>&1
  row "ncu gemm: rc=$? ($(grep -c 'gemm_m' "$OUT/ncu-gemm.txt") lines name a kernel)"
elif [[ " $stages " == *" ncu "* ]]; then
  # Nsight Compute on the attention kernels: by default the second decode shape (32K keys),
  # its first timed launch. NCU_SKIP / NCU_COUNT / NCU_SHAPES pick others, NCU_ARGS the report.
  ncu --kernel-name regex:flash_ --launch-skip ${NCU_SKIP:-5} --launch-count ${NCU_COUNT:-1} ${NCU_ARGS:---set full} \
    "$B/flash-bench" --shapes ${NCU_SHAPES:-decode} --iters 3 --warmup 0 > "$OUT/ncu-flash.txt" 2>&1
  row "ncu flash: rc=$? ($(grep -c 'flash_' "$OUT/ncu-flash.txt") lines name a kernel)"
fi
# One file of every log (the device returns few files), failures first.
{ grep -l -E "FAILED|panicked|ERROR SUMMARY: [1-9]" $LOGS/* 2>/dev/null | while read f; do echo "##### $f"; grep -E -B2 -A12 "panicked|FAILED|Invalid|hazard" "$f" | head -150; done
  # The sanitizer's logs (a subfolder) only where a test did not end clean.
  [ -f "$LOGS/sanitize/rc" ] && awk '$1 != 0 {print $2 "-" $3 "-" $4}' "$LOGS/sanitize/rc" | while read f; do
    echo "##### $f"; grep -v '^test .* \.\.\. ok$' "$LOGS/sanitize/$f.log" | tail -n 40; done
  for f in $LOGS/*; do [ -f "$f" ] || continue; echo "##### $f"; tail -n 60 "$f"; done; } > "$OUT/logs.txt"
echo; echo "=== summary ==="; cat "$summary"
