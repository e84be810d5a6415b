#!/usr/bin/env python3
"""Summarizes a kernel trace of decode steps (cuda_timeline_run.sh): Nsight Systems'
cuda_gpu_trace CSV or bench/cupti_trace.c's.

A step ends with the candidates' last kernel (topk_final), or where the GPU idled more
than GAP_US when no kernel has that name. Names are demangled with c++filt. Of the steps with
the most common kernel count, the median one (by span) is shown: each kernel's duration
and what it adds to the step (its end minus the previous kernel's end: with programmatic
dependent launch a kernel may start before the previous one ends), grouped by name,
then the step's first kernels and a stretch of its middle, in order.

Under bench/cupti_trace.c a replayed step holds one gap the untraced step does not:
~130-170 us before the first kernel after a host-to-device copy node (H200, 2026-12-01:
the traced span 1,580 us against 1,449 us a token untraced; with the copies made
kernels, branch meta-kernel, the gap moved to the step's first kernel and the
untraced step gained 0.6%). Read the kernels' added times, not that gap."""
import csv
import subprocess
import sys

GAP_US = 15.0


def demangled(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout
        return dict(zip(names, out.split("\n")))
    except OSError:
        return {n: n for n in names}


def short(name):
    name = name[5:] if name.startswith("void ") else name
    name = name.replace("(anonymous namespace)::", "")
    cut = name.find("(", name.rfind(">") if ">" in name else 0)
    return (name[:cut] if cut > 0 else name)[:60]


def main(path):
    rows = list(csv.DictReader(open(path)))
    if not rows:
        print(f"{path}: no kernels")
        return
    col = {k: next(c for c in rows[0] if c.startswith(k)) for k in ("Start", "Duration", "Name")}
    names = demangled(sorted({r[col["Name"]] for r in rows}))
    ks = sorted((int(r[col["Start"]]) / 1e3, int(r[col["Duration"]]) / 1e3, short(names[r[col["Name"]]]))
                for r in rows if r[col["Name"]])
    by_name = any("topk_final" in k[2] for k in ks)
    steps, cur, end = [], [], 0.0
    for k in ks:
        if cur and not by_name and k[0] - end > GAP_US:
            steps.append(cur)
            cur = []
        cur.append(k)
        end = max(end, k[0] + k[1])
        if by_name and "topk_final" in k[2]:
            steps.append(cur)
            cur = []
    if cur:
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
    print("\nthe step's first kernels, then a stretch of its middle (duration, added, start after the previous end):")
    mid = n // 2
    for name, d, add, gap in adds[:10] + [("...", 0, 0, 0)] + adds[mid - 4:mid + 10]:
        print(f"  {name:60} {d:7.2f} {add:7.2f} {gap:7.2f}")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        main(p)
