#!/usr/bin/env python3
"""Summarizes an Nsight Systems cuda_gpu_trace CSV of decode steps (cuda_timeline_run.sh).

Steps are runs of kernels separated by more than GAP_US of idle GPU. Of the steps with
the most common kernel count, the median one (by span) is shown: each kernel's duration
and what it adds to the step (its end minus the previous kernel's end: with programmatic
dependent launch a kernel may start before the previous one ends), grouped by name,
then the kernels of the middle layer in order."""
import csv
import re
import statistics
import sys

GAP_US = 15.0


def short(name):
    name = name[5:] if name.startswith("void ") else name
    cut = name.find("(", name.rfind(">") if ">" in name else 0)
    return (name[:cut] if cut > 0 else name)[:60]


def main(path):
    rows = list(csv.DictReader(open(path)))
    if not rows:
        print(f"{path}: no kernels")
        return
    col = {k: next(c for c in rows[0] if c.startswith(k)) for k in ("Start", "Duration", "Name")}
    ks = [(int(r[col["Start"]]) / 1e3, int(r[col["Duration"]]) / 1e3, short(r[col["Name"]])) for r in rows
          if r[col["Name"]] and not r[col["Name"]].startswith("[CUDA mem")]
    ks.sort()
    steps, cur, end = [], [], None
    for k in ks:
        if cur and k[0] - end > GAP_US:
            steps.append(cur)
            cur = []
        cur.append(k)
        end = max(end or 0, k[0] + k[1]) if cur[:-1] else k[0] + k[1]
    steps.append(cur)
    counts = {}
    for s in steps:
        counts[len(s)] = counts.get(len(s), 0) + 1
    n = max(counts, key=lambda c: (counts[c], c))
    same = [s for s in steps if len(s) == n][2:] or [s for s in steps if len(s) == n]
    span = lambda s: max(a + d for a, d, _ in s) - s[0][0]
    same.sort(key=span)
    step = same[len(same) // 2]
    print(f"{path}: {len(steps)} steps, {len(same)} of {n} kernels; median span {span(step):.1f} us "
          f"(min {span(same[0]):.1f}, max {span(same[-1]):.1f}); kernel time {sum(d for _, d, _ in step):.1f} us")
    adds, prev_end = [], step[0][0]
    for a, d, name in step:
        e = a + d
        adds.append((name, d, e - prev_end, a - prev_end))
        prev_end = max(prev_end, e)
    groups = {}
    for name, d, add, _ in adds:
        g = groups.setdefault(name, [0, 0.0, 0.0])
        g[0] += 1
        g[1] += d
        g[2] += add
    print(f"{'kernel':60} {'n':>4} {'dur us':>9} {'adds us':>9} {'per launch':>10}")
    for name, (c, d, add) in sorted(groups.items(), key=lambda kv: -kv[1][2]):
        print(f"{name:60} {c:4d} {d:9.1f} {add:9.1f} {add / c:10.2f}")
    mid = n // 2
    print("\none stretch of the step (duration, added, start after the previous end):")
    for name, d, add, gap in adds[mid - 8:mid + 8]:
        print(f"  {name:60} {d:7.2f} {add:7.2f} {gap:7.2f}")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        main(p)
