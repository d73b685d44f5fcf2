"""Sums Nsight Compute's per-launch durations by kernel name over whole decode steps and prints
a table. Input: a `ncu --csv --metrics gpu__time_duration.sum` report on stdin; argv[1] names
the kernel that starts each step (the embedding lookup). Only the launches from its first to
its last occurrence count. The kernels are timed one at a time, without the overlap that
dependent launches give in a real step."""
import csv
import sys
from collections import defaultdict

first = sys.argv[1] if len(sys.argv) > 1 else "embed"
unit = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
launches = []
for row in csv.DictReader(l for l in sys.stdin if l.startswith('"')):
    if row.get("Metric Name") == "gpu__time_duration.sum":
        value = float(row["Metric Value"].replace(",", ""))
        launches.append((row["Kernel Name"].split("(")[0], value * unit.get(row["Metric Unit"], 1.0)))
starts = [i for i, (name, _) in enumerate(launches) if name == first]
if len(starts) < 2:
    sys.exit(f"fewer than two '{first}' launches among {len(launches)}")
steps = len(starts) - 1
total, count = defaultdict(float), defaultdict(int)
for name, us in launches[starts[0]:starts[-1]]:
    total[name] += us
    count[name] += 1
whole = sum(total.values())
print(f"{steps} steps")
print("| kernel | launches per step | µs per step | % |")
print("|---|---|---|---|")
for name in sorted(total, key=total.get, reverse=True):
    print(f"| {name} | {count[name] / steps:g} | {total[name] / steps:.1f} | {100 * total[name] / whole:.1f} |")
print(f"| all | {sum(count.values()) / steps:g} | {whole / steps:.1f} | 100 |")
