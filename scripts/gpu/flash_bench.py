#!/usr/bin/env python3
"""Our FlashAttention kernels (the flash-bench binary) beside PyTorch's
scaled_dot_product_attention, FA2 and cuDNN backends, on the attention shapes of BENCHMARKS.md,
as one markdown table on stdout. The binary's stderr and per-run details go to stderr.

    python3 scripts/gpu/flash_bench.py --ours .gpu/bin/flash-bench [--dtype bf16|f16]
        [--iters 50] [--warmup 10] [--shapes prefill,decode] [--flush write|read] [--rounds 1]

Both sides time alike: `warmup` untimed runs, then the median of `iters` runs, each between two
CUDA events with L2 flushed before it. A write flush leaves L2 full of dirty lines, which the
timed kernel pays to write back; a read flush leaves it clean. Prefill cells are TFLOP/s
(4·B·H·S²·D, halved when causal), decode cells µs (GB/s of K and V read). A row still prints
when one side fails: the cell says n/a and a note below the table says why; the exit code is 0
whenever the table printed.

With `--rounds N` the binary and PyTorch take turns N times (a call's runs drift by a few
percent, more than some of the margins read here): each cell is the median over the rounds and
each ratio the median of the rounds' ratios, with their range beside it.
"""

import argparse
import json
import statistics
import subprocess
import sys
import warnings
from dataclasses import dataclass

OURS_TIMEOUT_S = 480


@dataclass(frozen=True)
class Shape:
    kind: str
    b: int
    h: int
    hkv: int
    s: int
    kv: int
    d: int
    causal: bool

    def key(self):
        return (self.kind, self.b, self.h, self.hkv, self.s, self.kv, self.d, self.causal)

    def label(self):
        if self.kind == "prefill":
            mask = "causal" if self.causal else "full"
            return f"prefill {self.b}, {self.h}, {self.s}, {self.d}, {mask}"
        return f"decode {self.b}, {self.h}, {self.hkv}, {self.kv}, {self.d}"

    def flops(self):
        f = 4 * self.b * self.h * self.s * self.kv * self.d
        return f / 2 if self.causal and self.kind == "prefill" else f

    def kv_bytes(self, elem=2):
        return 2 * self.b * self.hkv * self.kv * self.d * elem


def prefill(b, h, s, d, causal):
    return Shape("prefill", b, h, h, s, s, d, causal)


def decode(b, h, hkv, kv, d):
    return Shape("decode", b, h, hkv, 1, kv, d, True)


# flash-bench times the same rows; results are matched on every field of the shape.
SHAPES = [
    prefill(1, 32, 4096, 128, True),
    prefill(1, 32, 4096, 128, False),
    prefill(4, 32, 2048, 128, True),
    prefill(1, 32, 16384, 128, True),
    prefill(1, 32, 8192, 64, True),
    prefill(1, 16, 4096, 256, True),
    decode(1, 32, 8, 4096, 128),
    decode(1, 32, 8, 32768, 128),
    decode(1, 32, 8, 131072, 128),
    decode(8, 32, 8, 4096, 128),
    decode(8, 32, 8, 8192, 128),
]


@dataclass
class Result:
    """A median time, or why there is none; `note` qualifies a time (K/V expanded, or why
    the output is `wrong`)."""

    us: float = None
    error: str = None
    note: str = None
    wrong: bool = False


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def shape_of(rec):
    if rec["kind"] == "prefill":
        return prefill(rec["b"], rec["h"], rec["s"], rec["d"], rec["causal"])
    return decode(rec["b"], rec["h"], rec["hkv"], rec["kv"], rec["d"])


def text(out):
    if isinstance(out, bytes):
        return out.decode(errors="replace")
    return out or ""


def run_ours(path, args):
    """Results of flash-bench by shape, and an error for the shapes it gave none."""
    cmd = [path, "--dtype", args.dtype, "--iters", str(args.iters),
           "--warmup", str(args.warmup), "--shapes", args.shapes, "--flush", args.flush]
    log("running", " ".join(cmd))
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=OURS_TIMEOUT_S)
        out, err = p.stdout, p.stderr
        # The last line a crash prints is Rust's backtrace hint, not the reason.
        said = [l for l in err.splitlines() if l.strip() and not l.startswith("note: ")]
        missing = f"no result (exit code {p.returncode})"
        if p.returncode != 0 and said:
            missing += f": {said[-1]}"
    except subprocess.TimeoutExpired as e:
        out, err = text(e.stdout), text(e.stderr)
        missing = f"flash-bench timed out after {OURS_TIMEOUT_S} s"
    except OSError as e:
        return {}, f"cannot run {path}: {e.strerror or e}"
    if err.strip():
        log(err.rstrip())
    results = {}
    for line in out.splitlines():
        log("ours:", line)
        try:
            rec = json.loads(line)
            shape = shape_of(rec)
        except (ValueError, KeyError, TypeError):
            continue
        if "us" in rec:
            results[shape.key()] = Result(us=float(rec["us"]), note=rec.get("error"),
                                          wrong="error" in rec)
        else:
            results[shape.key()] = Result(error=rec.get("error", f"no time in {line}"))
    return results, missing


def first_line(e):
    lines = [l.strip() for l in str(e).splitlines() if l.strip()]
    return lines[0] if lines else type(e).__name__


def median_us(torch, fn, iters, warmup, flush):
    for _ in range(warmup):
        fn()
    marks = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
             for _ in range(iters)]
    for start, end in marks:
        flush()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return 1e3 * statistics.median(s.elapsed_time(e) for s, e in marks)


def try_call(torch, fn):
    """None if `fn` runs, else why not: the error and the reasons PyTorch warned about."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fn()
            torch.cuda.synchronize()
            return None
        except Exception as e:
            why = [first_line(e)] + [first_line(w.message) for w in caught]
            return "; ".join(dict.fromkeys(why))


def time_backend(torch, F, sdpa_kernel, backend, shape, q, k, v, args, flush):
    """One backend on one shape; with GQA, K and V expanded to every query head when the
    backend refuses `enable_gqa`."""

    def call(k=k, v=v, **kw):
        with sdpa_kernel(backend):
            # One query at the last position sees every key; is_causal would align the mask
            # to the top left and let it see only the first.
            causal = shape.causal and shape.kind == "prefill"
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, **kw)

    gqa = shape.hkv != shape.h
    fn, note = call, None
    if gqa:
        fn = lambda: call(enable_gqa=True)  # noqa: E731
    why = try_call(torch, fn)
    if why is not None and gqa:
        group = shape.h // shape.hkv
        ke, ve = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        expanded = lambda: call(ke, ve)  # noqa: E731
        why_expanded = try_call(torch, expanded)
        if why_expanded is not None:
            return Result(error=f"enable_gqa: {why}; with K/V expanded: {why_expanded}")
        note = (f"K/V expanded to {shape.h} heads (GB/s still counts {shape.hkv}); "
                f"enable_gqa refused: {why}")
        fn, why = expanded, None
    if why is not None:
        return Result(error=why)
    try:
        return Result(us=median_us(torch, fn, args.iters, args.warmup, flush), note=note)
    except Exception as e:
        return Result(error=first_line(e))


def run_torch(shapes, args):
    """Results by backend name and shape, a reason that covers every cell when PyTorch
    cannot run at all, and the GPU's name."""
    names = [("FA2", "FLASH_ATTENTION"), ("cuDNN", "CUDNN_ATTENTION")]
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception as e:
        return {}, f"PyTorch unavailable: {first_line(e)}", None
    if not torch.cuda.is_available():
        return {}, "PyTorch sees no CUDA device", None
    log(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    gpu = torch.cuda.get_device_name(0)
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 64 << 20
    l2_words = l2 // 4
    buf = torch.empty(4 * l2_words, dtype=torch.int32, device="cuda")  # four times the L2
    if args.flush == "write":
        flush = buf.zero_
    else:
        flush = lambda: buf[: 2 * l2_words].sum()  # noqa: E731
    results = {name: {} for name, _ in names}
    for shape in shapes:
        g = torch.Generator(device="cuda").manual_seed(0)

        def rand(*dims):
            return (torch.rand(dims, generator=g, device="cuda") * 2 - 1).to(dtype)

        try:
            q = rand(shape.b, shape.h, shape.s, shape.d)
            k = rand(shape.b, shape.hkv, shape.kv, shape.d)
            v = rand(shape.b, shape.hkv, shape.kv, shape.d)
        except Exception as e:
            for name, _ in names:
                results[name][shape.key()] = Result(error=f"inputs: {first_line(e)}")
            continue
        for name, attr in names:
            backend = getattr(SDPBackend, attr, None)
            if backend is None:
                r = Result(error=f"this PyTorch has no SDPBackend.{attr}")
            else:
                r = time_backend(torch, F, sdpa_kernel, backend, shape, q, k, v, args, flush)
            results[name][shape.key()] = r
            log(f"{name} {shape.label()}: " + (f"{r.us:.1f} us" if r.us else f"n/a: {r.error}"))
        del q, k, v
        torch.cuda.empty_cache()
    return results, None, gpu


def gpu_name():
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
        names = p.stdout.strip().splitlines()
        return names[0] if p.returncode == 0 and names else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class Notes:
    """Footnotes numbered in order of first use; a repeated reason keeps its number."""

    def __init__(self):
        self.by_text = {}

    def mark(self, why):
        why = " ".join(why.replace("|", "/").split())
        n = self.by_text.setdefault(why, len(self.by_text) + 1)
        return f"[{n}]"

    def lines(self):
        return [f"[{n}] {why}" for why, n in self.by_text.items()]


def throughput(shape, r):
    return shape.flops() / r.us / 1e6 if shape.kind == "prefill" else 1.0 / r.us


def cell(shape, r, notes):
    if r.us is None:
        return "n/a " + notes.mark(r.error)
    if shape.kind == "prefill":
        s = f"{throughput(shape, r):.1f}"
    else:
        s = f"{r.us:.1f} ({shape.kv_bytes() / r.us / 1e3:.0f})"
    if r.wrong:
        s += " WRONG"
    return s + (" " + notes.mark(r.note) if r.note else "")


def ratio(shape, ours, other):
    if ours.us is None or ours.wrong or other.us is None:
        return "-"
    return f"{throughput(shape, ours) / throughput(shape, other):.2f}"


def ratio_cell(shape, ours_rounds, peer_rounds):
    """The median of the rounds' ratios, with their range when there are several."""
    ratios = [ratio(shape, o, p) for o, p in zip(ours_rounds, peer_rounds)]
    ratios = [float(r) for r in ratios if r != "-"]
    if not ratios:
        return "-"
    mid = f"{statistics.median(ratios):.2f}"
    return mid if len(ratios) == 1 else f"{mid} ({min(ratios):.2f}–{max(ratios):.2f})"


def combine(rounds):
    """One result from a cell's rounds: the median time of those that have one, wrong if any
    was, else the first error."""
    timed = [r for r in rounds if r.us is not None]
    if not timed:
        return rounds[0]
    return Result(us=statistics.median(r.us for r in timed), note=timed[0].note,
                  wrong=any(r.wrong for r in timed))


def table(shapes, ours_rounds, peers_rounds, gpu, args):
    """The table from each round's results (ours: by shape; peers: by name, then shape)."""
    notes = Notes()
    ours = {k: combine([r[k] for r in ours_rounds]) for k in ours_rounds[0]}
    rounds = f"{len(ours_rounds)} alternated rounds, cells their median; " if len(ours_rounds) > 1 else ""
    rows = [
        f"Attention, {args.dtype}: prefill in TFLOP/s, decode in us (GB/s); {rounds}median of "
        f"{args.iters} runs, L2 flushed by a {args.flush} before each; ours/peer is the speed "
        "ratio (above 1: ours is faster).",
        "",
        "| shape | ours | FA2 | cuDNN | ours/FA2 | ours/cuDNN |",
        "|---|---|---|---|---|---|",
    ]
    for shape in shapes:
        key = shape.key()
        o = ours[key]
        mine = [r[key] for r in ours_rounds]
        fa2s, cudnns = ([r[name][key] for r in peers_rounds] for name in ("FA2", "cuDNN"))
        rows.append(f"| {shape.label()} | {cell(shape, o, notes)} | {cell(shape, combine(fa2s), notes)} | "
                    f"{cell(shape, combine(cudnns), notes)} | {ratio_cell(shape, mine, fa2s)} | "
                    f"{ratio_cell(shape, mine, cudnns)} |")
    rows += [""] + notes.lines() + [f"GPU: {gpu}"]
    return rows


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ours", required=True, help="path of the flash-bench binary")
    p.add_argument("--dtype", choices=["bf16", "f16"], default="bf16")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--shapes", default="prefill,decode",
                   help="comma-separated kinds: prefill, decode")
    p.add_argument("--flush", choices=["write", "read"], default="write",
                   help="how L2 is emptied before each timed run")
    p.add_argument("--rounds", type=int, default=1,
                   help="times the binary and PyTorch take turns")
    a = p.parse_args(argv)
    kinds = [k.strip() for k in a.shapes.split(",")]
    if a.iters < 1 or a.warmup < 0 or a.rounds < 1:
        p.error("--iters and --rounds must be at least 1 and --warmup at least 0")
    if not kinds or any(k not in ("prefill", "decode") for k in kinds):
        p.error(f"--shapes {a.shapes}: expected prefill and/or decode")
    a.kinds = kinds
    return a


def main(argv=None):
    args = parse_args(argv)
    shapes = [s for s in SHAPES if s.kind in args.kinds]
    rounds, gpu = [], None
    for n in range(args.rounds):
        if args.rounds > 1:
            log(f"round {n + 1} of {args.rounds}")
        # The binary runs first, before PyTorch holds any GPU memory (run_torch gives its
        # cache back after each shape).
        ours, ours_missing = run_ours(args.ours, args)
        shapes += [Shape(*k) for k in ours if k not in {s.key() for s in shapes}]
        peers, torch_missing, gpu = run_torch(shapes, args)
        rounds.append((ours, ours_missing, peers, torch_missing))
    # Every cell of every round, once all shapes are known, says why it has no time.
    for ours, ours_missing, peers, torch_missing in rounds:
        for s in shapes:
            ours.setdefault(s.key(), Result(error=ours_missing))
            for name in ("FA2", "cuDNN"):
                peers.setdefault(name, {}).setdefault(s.key(), Result(error=torch_missing or "not measured"))
    ours_rounds = [r[0] for r in rounds]
    peers_rounds = [r[2] for r in rounds]
    for row in table(shapes, ours_rounds, peers_rounds, gpu or gpu_name(), args):
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
