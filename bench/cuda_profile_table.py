#!/usr/bin/env python3
"""Summarizes an `ncu --csv --metrics gpu__time_duration.sum` log (bench/cuda_profile_run.sh):
the kernels of the last forward pass (from the last embedding lookup on), grouped by
name, with launches, total and mean microseconds."""
import csv
import sys
from collections import OrderedDict


def main(path):
    rows = []
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "ns")
        us = v / 1000.0 if unit in ("nsecond", "ns") else v * 1000.0 if unit in ("msecond", "ms") else v
        rows.append((r["Kernel Name"], us))
    if not rows:
        print(f"no kernels in {path}")
        return
    start = max(i for i, (k, _) in enumerate(rows) if "get_rows" in k)
    last = rows[start:]
    groups = OrderedDict()
    for k, us in last:
        short = k.split("(")[0].split("<")[0][:48]
        g = groups.setdefault(short, [0, 0.0])
        g[0] += 1
        g[1] += us
    total = sum(us for _, us in last)
    print(f"last forward pass: {len(last)} kernels, {total:.1f} us of kernel time")
    print(f"{'kernel':48} {'launches':>8} {'total us':>10} {'mean us':>9} {'share':>6}")
    for k, (n, us) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        print(f"{k:48} {n:8d} {us:10.1f} {us / n:9.2f} {100 * us / total:5.1f}%")


if __name__ == "__main__":
    main(sys.argv[1])
