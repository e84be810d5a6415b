#!/usr/bin/env python3
"""Summarizes an Nsight Systems GPU trace (`nsys stats --report cuda_gpu_trace --format csv`,
bench/cuda_profile_run.sh): the last LAST forward passes (a pass starts at an embedding
lookup, `get_rows`), each kernel name's launches and microseconds per pass, and the
pass's wall time on the GPU (first kernel start to last kernel end) against its sum of
kernel time: the difference is gaps between kernels (launch latency, host waits).

usage: cuda_trace_table.py TRACE.csv [LAST]"""
import csv
import sys
from collections import OrderedDict


def main(path, last=8):
    rows = []
    with open(path, newline="") as f:
        lines = [ln for ln in f if "," in ln]
    for r in csv.DictReader(lines):
        name = r.get("Name") or r.get("Kernel Name") or ""
        if not r.get("Duration (ns)") or not r.get("Start (ns)"):
            continue
        if "[CUDA mem" in name:  # copies and sets: keep, they are on the stream too
            pass
        rows.append((int(r["Start (ns)"]), int(r["Duration (ns)"]), name))
    rows.sort()
    starts = [i for i, (_, _, k) in enumerate(rows) if "get_rows" in k]
    if len(starts) < 2:
        print(f"{path}: fewer than two passes")
        return
    starts = starts[-(last + 1):]
    groups = OrderedDict()
    walls, sums, counts = [], [], []
    for a, b in zip(starts, starts[1:]):
        seg = rows[a:b]
        walls.append((seg[-1][0] + seg[-1][1] - seg[0][0]) / 1000.0)
        sums.append(sum(d for _, d, _ in seg) / 1000.0)
        counts.append(len(seg))
        for _, d, k in seg:
            short = k.split("(")[0].split("<")[0][:52]
            g = groups.setdefault(short, [0, 0.0])
            g[0] += 1
            g[1] += d / 1000.0
    n = len(walls)
    wall, ksum = sum(walls) / n, sum(sums) / n
    print(f"last {n} passes: {sum(counts) / n:.0f} kernels/copies a pass, {ksum:.1f} us of GPU work, "
          f"{wall:.1f} us from first start to last end ({100 * ksum / wall:.0f}% busy)")
    print(f"{'kernel':52} {'per pass':>8} {'us/pass':>9} {'mean us':>8} {'share':>6}")
    for k, (c, us) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        print(f"{k:52} {c / n:8.1f} {us / n:9.1f} {us / c:8.2f} {100 * us / n / ksum:5.1f}%")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 8)
