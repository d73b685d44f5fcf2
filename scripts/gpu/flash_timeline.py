#!/usr/bin/env python3
"""Where the wgmma prefill and the decode kernels' time goes, from the timelines
`flash-bench --timeline DIR` writes (one file per shape; `Timeline` in
crates/akunu-cuda/kernels/flash.cu).

    scripts/gpu/flash_timeline.py [--trace BLOCK:FIRST:COUNT] FILE.timeline...

For each file: every consumer warpgroup's time split into what it was doing between marks
(waiting for K and its turn, from issue to scores, the softmax up to packed probabilities, the
step's loop overhead, an item's last P V, its stores, waiting for the first item and for the
next), in % of its span and in cycles per occurrence; the steps an item took; how far ahead of
the consumers the loading warp issued each K tile and the preparing warps each item's queries,
where the preparing warps' time goes, and the block's first item part by part (nothing
overlaps it); and how the blocks' ends spread. `--trace` also lists one block's marks from all
its streams in time order (COUNT of them from the FIRST), cycles from the block's start, to
read how the two warpgroups take turns.

For a decode file: each block's phases in us (start to rows known, to the first tile, the
first warp's steps, waiting for the other warps, the stores, the split count and the merge),
min / median / max over blocks, when the blocks start and end against the launch's first
start, and the SMs whose steps ran fastest and slowest.
"""
import array
import statistics
import struct
import sys

MAGIC = int.from_bytes(b"AKTL", "little")
(START, NS, ITEM, WAIT_K, ISSUE, SCORES, STEP, LAST_PV, STORED, END,
 LOAD_K, LOAD_V, PREP, PREP_ITEM, PREP_Q,
 DEC_SM, DEC_RANGE, DEC_FIRST, DEC_LOOP, DEC_WARPS, DEC_STATES, DEC_STORED, DEC_COUNTED,
 DEC_SPUN) = range(1, 25)
CONSUMERS = 2  # streams 0 and 1; stream 2 is the loading warp, 3 the preparing warps

# Consumer phases: the mark that opens each and how it is named.
PHASES = [
    ("K + turn", "waiting for K_j and the turn"),
    ("scores", "S_j issued until it landed"),
    ("softmax", "masks, softmax, P V wait, packing"),
    ("loop", "packed until the next step waits"),
    ("last PV", "the item's last P V"),
    ("store", "normalise and store the rows"),
    ("first item", "the block starts until its first item begins"),
    ("next item", "stored until the next item begins"),
    ("setup", "item begins until its first step"),
    ("tail", "no item left"),
]
# The phase that runs from each mark to the next one.
PHASE_AFTER = {
    WAIT_K: "K + turn",
    ISSUE: "scores",
    SCORES: "softmax",
    STEP: "loop",
    LAST_PV: "store",
    STORED: "next item",
    START: "first item",
    ITEM: "setup",
}


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    magic, blocks, streams, records = struct.unpack_from("<4I", data)
    if magic != MAGIC:
        raise SystemExit(f"{path}: not a timeline file")
    words = array.array("I", data[16:16 + 8 * blocks * streams * records])
    if sys.byteorder != "little":
        words.byteswap()
    out = []
    for b in range(blocks):
        per = []
        for s in range(streams):
            at = 2 * records * (b * streams + s)
            marks = []
            for r in range(records):
                clock, tagged = words[at + 2 * r], words[at + 2 * r + 1]
                if tagged == 0:
                    break
                marks.append((clock, tagged >> 24, tagged & 0xFFFFFF))
            per.append(marks)
        out.append(per)
    return out


def cycles(a, b):
    """Clock b minus clock a, through the 32-bit wrap."""
    return (b - a) & 0xFFFFFFFF


def signed_cycles(a, b):
    """Clock b minus clock a, negative where b is the earlier of the two."""
    d = cycles(a, b)
    return d if d < 1 << 31 else d - (1 << 32)


def clock_rate(marks):
    """Cycles per ns from the stream's two global-timer marks, or None."""
    ns = [(i, m) for i, m in enumerate(marks) if m[1] == NS]
    if len(ns) < 2 or ns[0][0] == 0:
        return None
    (i0, n0), (i1, n1) = ns[0], ns[-1]
    dt = cycles(n0[0], n1[0])
    return cycles(marks[i0 - 1][0], marks[i1 - 1][0]) / dt if dt else None


def consumer_phases(marks):
    """Cycles per phase, and the occurrences of each."""
    total = {name: 0 for name, _ in PHASES}
    count = {name: 0 for name, _ in PHASES}
    timed = [m for m in marks if m[1] != NS]
    for (c0, e0, _), (c1, e1, _) in zip(timed, timed[1:]):
        if e0 == STEP and e1 == LAST_PV:
            name = "last PV"
        elif e1 == END:
            name = "tail"
        else:
            name = PHASE_AFTER.get(e0)
        if name is None:
            continue
        total[name] += cycles(c0, c1)
        count[name] += 1
    return total, count


def item_steps(marks):
    """Steps of each item the stream took."""
    steps, current = [], None
    for _, e, v in marks:
        if e == ITEM:
            if current is not None:
                steps.append(current)
            current = 0
        elif e == WAIT_K and current is not None:
            current += 1
    if current is not None:
        steps.append(current)
    return steps


def k_lead(loader, consumer):
    """For each step of the block, cycles from the loading warp's K issue to the consumer's
    wait for it (negative: the consumer waited before the load was issued)."""
    issued = [c for c, e, _ in loader if e == LOAD_K]
    waits = [c for c, e, _ in consumer if e == WAIT_K]
    return [signed_cycles(i, w) for i, w in zip(issued, waits)]


def prep_lead(prep, consumer):
    """For each item the consumer took, cycles from the preparing warps' issue of its queries
    to the consumer's start of it (the queries still had to land)."""
    issued = {v: c for c, e, v in prep if e == PREP_Q}
    return [signed_cycles(issued[v], c) for c, e, v in consumer if e == ITEM and v in issued]


# The block's first item, which nothing overlaps, in the order its marks come.
FIRST_ITEM = [
    "block start to the preparing warps' start",
    "index",
    "rows and queries issued",
    "queries landed, consumers woken",
]


def first_item(prep, consumer):
    """Cycles of each FIRST_ITEM part of the block's first item, from the consumer's start
    and first item marks and the preparing warps' marks of it; None without them all."""
    start = next((c for c, e, _ in consumer if e == START), None)
    item = next((c for c, e, _ in consumer if e == ITEM), None)
    marks = [next((c for c, e, _ in prep if e == want), None) for want in (PREP, PREP_ITEM, PREP_Q)]
    if start is None or item is None or None in marks:
        return None
    points = [start] + marks + [item]
    return [signed_cycles(a, b) for a, b in zip(points, points[1:])]


# The preparing warps' phases: from each mark to the next.
PREP_PHASES = [
    (PREP_Q, PREP, "waiting for a free slot"),
    (START, PREP, "waiting for a free slot"),
    (PREP, PREP_ITEM, "taking the item's index"),
    (PREP_ITEM, PREP_Q, "rows and queries"),
]


def prep_phases(marks):
    total, count = {}, {}
    timed = [m for m in marks if m[1] != NS]
    for (c0, e0, _), (c1, e1, _) in zip(timed, timed[1:]):
        for a, b, name in PREP_PHASES:
            if (e0, e1) == (a, b):
                total[name] = total.get(name, 0) + cycles(c0, c1)
                count[name] = count.get(name, 0) + 1
    return total, count


def summary(path, blocks):
    totals = {name: 0 for name, _ in PHASES}
    counts = {name: 0 for name, _ in PHASES}
    spans, steps, leads, rates, ends, q_leads, firsts = [], [], [], [], [], [], []
    prep_total, prep_count = {}, {}
    for streams in blocks:
        prep = streams[3] if len(streams) > 3 else None
        if prep:
            t, c = prep_phases(prep)
            for name in t:
                prep_total[name] = prep_total.get(name, 0) + t[name]
                prep_count[name] = prep_count.get(name, 0) + c[name]
        for s in range(CONSUMERS):
            marks = streams[s]
            if not marks:
                continue
            timed = [m for m in marks if m[1] != NS]
            spans.append(cycles(timed[0][0], timed[-1][0]))
            t, c = consumer_phases(marks)
            for name in totals:
                totals[name] += t[name]
                counts[name] += c[name]
            steps += item_steps(marks)
            leads += k_lead(streams[2], marks)
            if prep:
                q_leads += prep_lead(prep, marks)
                first = first_item(prep, marks)
                if first:
                    firsts.append(first)
            rate = clock_rate(marks)
            if rate:
                rates.append(rate)
            ns = [m[0] for m in marks if m[1] == NS]
            if len(ns) >= 2:
                ends.append(ns[-1])
    if not spans:
        print(f"{path}: no records")
        return
    span = sum(spans)
    ghz = statistics.median(rates) if rates else None
    print(f"## {path}")
    print()
    print(f"{len(spans)} consumer warpgroups, {len(steps)} items, "
          f"{sum(steps)} steps ({statistics.mean(steps):.1f} an item, at most {max(steps)}); "
          f"span {statistics.mean(spans):,.0f} cycles a warpgroup"
          + (f" ({statistics.mean(spans) / ghz / 1e3:.1f} us at {ghz:.2f} GHz)" if ghz else ""))
    print()
    print("| phase | what | % of span | cycles each | occurrences |")
    print("|---|---|---|---|---|")
    for name, what in PHASES:
        n = counts[name]
        each = f"{totals[name] / n:,.0f}" if n else "-"
        print(f"| {name} | {what} | {100 * totals[name] / span:.1f} | {each} | {n} |")
    print()
    if leads:
        q = statistics.quantiles(leads, n=10)
        late = sum(1 for x in leads if x < 0)
        print(f"K issued ahead of the consumer's wait: median {statistics.median(leads):,.0f} cycles, "
              f"10th percentile {q[0]:,.0f}; {late} of {len(leads)} steps waited for the issue itself")
    if q_leads:
        q = statistics.quantiles(q_leads, n=10)
        print(f"queries issued ahead of the consumer's item start: median {statistics.median(q_leads):,.0f} cycles, "
              f"10th percentile {q[0]:,.0f}, fewest {min(q_leads):,}")
    if prep_count:
        print("preparing warps, cycles each: " + ", ".join(
            f"{name} {prep_total[name] / prep_count[name]:,.0f} ({prep_count[name]})" for name in prep_total))
    if firsts:
        print("the first item, median cycles over warpgroups: " + ", ".join(
            f"{name} {statistics.median(f[i] for f in firsts):,.0f}" for i, name in enumerate(FIRST_ITEM)))
    if len(ends) > 1 and ghz:
        first = min(ends)
        late = sorted(cycles(first, e) / 1e3 for e in ends)
        print(f"warpgroups' ends after the first one's: median {statistics.median(late):.1f} us, "
              f"last {late[-1]:.1f} us")
    print()


# Decode phases: the marks that open and close each, and how it is named.
DEC_PHASES = [
    (START, DEC_RANGE, "rows", "start until the rows and their key range are known"),
    (DEC_RANGE, DEC_FIRST, "first tile", "until the first warp's first tile landed"),
    (DEC_FIRST, DEC_LOOP, "steps", "the first warp's steps"),
    (DEC_LOOP, DEC_WARPS, "other warps", "waiting for the block's other warps"),
    (DEC_WARPS, DEC_STORED, "store", "warps' states combined, rows stored"),
    (DEC_WARPS, DEC_STATES, "store: states", "... the warps' states into shared memory"),
    (DEC_STATES, DEC_STORED, "store: rows", "... combined and stored"),
    (DEC_STORED, DEC_COUNTED, "last known", "until the barrier tells whether the split arrived last"),
    (DEC_STORED, END, "count, merge", "counted and (the last split) merged"),
    (DEC_COUNTED, END, "end", "the last split merged, the others counted their rows stored"),
    (DEC_COUNTED, DEC_SPUN, "merge: wait", "... until every split's rows were stored (last split)"),
    (DEC_SPUN, END, "merge: rows", "... the rows merged and stored (last split)"),
]


def decode_summary(path, blocks):
    """Decode blocks' phases in us; each block's clock mapped to the global timer by its start,
    at the median clock rate over blocks."""
    recs = []
    for streams in blocks:
        marks = streams[0] if streams else []
        if not marks:
            continue
        rate = clock_rate(marks)
        at = {e: c for c, e, _ in marks if e != NS}
        ns = [c for c, e, _ in marks if e == NS]
        values = {e: v for _, e, v in marks}
        recs.append((marks[0][0], ns[0] if ns else None, rate, at, values))
    rates = [r for _, _, r, _, _ in recs if r]
    if not recs or not rates or any(n is None for _, n, _, _, _ in recs):
        print(f"{path}: no decode records")
        return
    ghz = statistics.median(rates)
    origin = min(n for _, n, _, _, _ in recs)

    def when(rec, e):
        """us from the launch's first start to the block's mark e, or None."""
        c0, n0, _, at, _ = rec
        return None if e not in at else ((n0 - origin) + cycles(c0, at[e]) / ghz) / 1e3

    merged = [r for r in recs if r[4].get(END) == 1]
    print(f"## {path}")
    print()
    print(f"{len(recs)} blocks, {len(merged)} merged splits' rows; {ghz:.2f} GHz")
    print()
    print("| phase | what | min | median | max | merging blocks' median |")
    print("|---|---|---|---|---|---|")
    # A kernel that marks the count splits "count, merge" in two.
    counted = any(DEC_COUNTED in r[3] for r in recs)
    for a, b, name, what in DEC_PHASES:
        if (a, b) == (DEC_STORED, END) and counted:
            continue
        spans = [(tb - ta, r in merged) for r in recs
                 for ta, tb in [(when(r, a), when(r, b))] if ta is not None and tb is not None]
        if not spans:
            continue
        xs = [x for x, _ in spans]
        ms = [x for x, m in spans if m]
        mm = f"{statistics.median(ms):.2f}" if ms else "-"
        print(f"| {name} | {what} | {min(xs):.2f} | {statistics.median(xs):.2f} | {max(xs):.2f} | {mm} |")
    reads = [r[4][DEC_SPUN] for r in merged if DEC_SPUN in r[4]]
    if reads:
        print()
        print(f"counter reads of the merging blocks' wait: median {statistics.median(reads)}, most {max(reads)}")
    print()
    for e, name in ((START, "start"), (DEC_FIRST, "first tile"), (DEC_LOOP, "first warp's steps done"),
                    (DEC_WARPS, "every warp's steps done"), (END, "end")):
        xs = sorted(x for x in (when(r, e) for r in recs) if x is not None)
        if xs:
            print(f"blocks' {name}: {xs[0]:.2f} / {statistics.median(xs):.2f} / {xs[-1]:.2f} us "
                  "after the launch's first start (first / median / last)")
    by_sm = {}
    for r in recs:
        if DEC_FIRST in r[3] and DEC_LOOP in r[3] and r[4].get(DEC_FIRST):
            us = cycles(r[3][DEC_FIRST], r[3][DEC_LOOP]) / ghz / 1e3
            by_sm.setdefault(r[4].get(DEC_SM), []).append(us / r[4][DEC_FIRST])
    if len(by_sm) > 8:
        per = sorted((statistics.median(v), sm) for sm, v in by_sm.items())
        print("us a step of the first warp, fastest SMs: " + ", ".join(f"{sm} {x:.3f}" for x, sm in per[:4])
              + "; slowest: " + ", ".join(f"{sm} {x:.3f}" for x, sm in per[-4:]))
    print()


NAMES = {START: "start", NS: "ns", ITEM: "item", WAIT_K: "wait K", ISSUE: "issue",
         SCORES: "scores", STEP: "packed", LAST_PV: "last PV", STORED: "stored", END: "end",
         LOAD_K: "load K", LOAD_V: "load V", PREP: "slot free", PREP_ITEM: "index",
         PREP_Q: "queries issued"}
STREAMS = ["wg0", "wg1", "loader", "prep"]


def trace(path, streams, block, first, count):
    starts = [m[0][0] for m in streams if m]
    if not starts:
        print(f"{path}: block {block} recorded nothing")
        return
    origin = starts[0]
    merged = sorted(
        (signed_cycles(origin, c), s, e, v)
        for s, marks in enumerate(streams) for c, e, v in marks if e != NS)
    print(f"## {path}, block {block}: marks {first}..{first + count - 1} of {len(merged)}")
    print()
    print("| cycle | stream | mark | value | cycles since the stream's last mark |")
    print("|---|---|---|---|---|")
    last = {}
    for t, s, e, v in merged[first:first + count]:
        gap = t - last[s] if s in last else ""
        last[s] = t
        print(f"| {t:,} | {STREAMS[s]} | {NAMES.get(e, e)} | {v} | {gap} |")
    print()


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    spec = None
    if argv[0] == "--trace":
        if len(argv) < 3:
            print(__doc__)
            return 2
        spec = [int(x) for x in argv[1].split(":")]
        argv = argv[2:]
    for path in argv:
        blocks = read(path)
        if any(e == DEC_SM for streams in blocks for marks in streams[:1] for _, e, _ in marks[:4]):
            decode_summary(path, blocks)
            continue
        summary(path, blocks)
        if spec:
            trace(path, blocks[spec[0]], *spec)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
