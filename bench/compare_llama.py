#!/usr/bin/env python3
"""Lumen vs llama.cpp on the CPU: same GGUF, threads, prompt and generation lengths.

For each model and thread count, alternates runs of `lumen bench` and of llama.cpp
(llama-cpp-python, pinned, built from source for this CPU in a virtual environment that
this script creates on first use), and prints the medians and their ratio for prompt
processing (pp: one batch of P tokens) and generation (tg: G tokens one at a time), plus
the fraction of the memory-bandwidth limit reached in generation:
    bytes of weights read per token * tokens/s / measured read bandwidth.

usage: bench/compare_llama.py [--models NAME...] [--threads 1 2] [--pp 512] [--tg 128]
                              [--reps 5] [--venv DIR] [--lumen build/lumen] [--json FILE]
(--pp 0 or --tg 0 skips that measure.)
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
DEFAULT_VENV = os.path.join(os.path.expanduser(os.environ.get("LUMEN_HOME", "~/.cache/lumen")), "bench-venv")

# Runs inside the venv: times llama.cpp's prefill and decode with the same protocol
# as `lumen bench` (fixed pseudo-random ids, a warm-up run, then the measured runs).
LLAMA_RUNNER = r'''
import json, sys, time
import llama_cpp
from llama_cpp import llama_cpp as capi
# This CPU advertises AMX, but AMX tile instructions fault on these virtual machines;
# ggml uses them through its "extra buffer types", so those are turned off.
_default = capi.llama_model_default_params
def _params():
    p = _default(); p.use_extra_bufts = False; return p
capi.llama_model_default_params = _params
path, threads, n_prompt, n_gen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
llm = llama_cpp.Llama(model_path=path, n_ctx=max(n_prompt, n_gen + 8) + 16, n_batch=max(n_prompt, 8),
                      n_ubatch=max(n_prompt, 8), n_threads=threads, n_threads_batch=threads, verbose=False)
n_vocab = llm.n_vocab()
x, ids = 12345, []
for _ in range(max(n_prompt, 8)):
    x = (x * 1664525 + 1013904223) % 2**32
    ids.append(x % n_vocab)
def pp():
    llm.reset(); t = time.perf_counter(); llm.eval(ids[:n_prompt]); return n_prompt / (time.perf_counter() - t)
def tg():
    llm.reset(); llm.eval(ids[:8]); t = time.perf_counter()
    for i in range(n_gen): llm.eval([ids[i % 8]])
    return n_gen / (time.perf_counter() - t)
out = {}
if n_prompt: pp(); out["pp"] = pp()
if n_gen: out["tg"] = tg()
print(json.dumps(out))
'''


def ensure_venv(venv):
    py = os.path.join(venv, "bin", "python")
    probe = [py, "-c", "import llama_cpp; print(llama_cpp.__version__)"]
    if os.path.exists(py) and subprocess.run(probe, capture_output=True).returncode == 0:
        return py
    print(f"creating {venv} and building {LLAMA_CPP_PYTHON} for this CPU (takes a while)...", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    env = dict(os.environ, CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF",
               CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2))
    subprocess.run([py, "-m", "pip", "install", "--no-cache-dir", LLAMA_CPP_PYTHON, "numpy"], check=True, env=env)
    return py


def model_path(lumen, name):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "lumen_pull.py"), "--path", name],
                         capture_output=True, text=True)
    if out.returncode != 0:
        subprocess.run([lumen, "pull", name], check=True)
        out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "lumen_pull.py"), "--path", name],
                             capture_output=True, text=True, check=True)
    return out.stdout.strip()


def run_lumen(lumen, path, threads, n_prompt, n_gen):
    out = subprocess.run([lumen, "bench", path, "-p", str(n_prompt), "-n", str(n_gen), "-t", str(threads),
                          "-r", "1", "--json"], capture_output=True, text=True, check=True)
    j = json.loads(out.stdout)
    return {"pp": j.get("pp_tokens_per_s", 0.0) if n_prompt else 0.0, "tg": j.get("tg_tokens_per_s", 0.0) if n_gen else 0.0,
            "weight_bytes": j["weight_bytes"]}


def run_llama(py, path, threads, n_prompt, n_gen):
    out = subprocess.run([py, "-c", LLAMA_RUNNER, path, str(threads), str(n_prompt), str(n_gen)],
                         capture_output=True, text=True, check=True)
    j = json.loads(out.stdout.strip().splitlines()[-1])
    return {"pp": j.get("pp", 0.0), "tg": j.get("tg", 0.0)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m", "qwen2.5-coder-1.5b"])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--venv", default=DEFAULT_VENV)
    ap.add_argument("--lumen", default=os.path.join(ROOT, "build", "lumen"))
    ap.add_argument("--membw", default=os.path.join(ROOT, "build", "bench_membw"))
    ap.add_argument("--json", help="also write all figures to this file")
    args = ap.parse_args()

    py = ensure_venv(args.venv)
    version = subprocess.run([py, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()
    rows = []
    for name in args.models:
        path = model_path(args.lumen, name)
        for t in args.threads:
            bw = json.loads(subprocess.run([args.membw, str(t), "--json"], capture_output=True, text=True,
                                           check=True).stdout)["read_gb_per_s"]
            ours, peer = {"pp": [], "tg": []}, {"pp": [], "tg": []}
            wbytes = 0
            for r in range(args.reps):  # alternate, so drifts in machine load hit both alike
                a = run_lumen(args.lumen, path, t, args.pp, args.tg)
                b = run_llama(py, path, t, args.pp, args.tg)
                wbytes = a["weight_bytes"]
                for k in ("pp", "tg"):
                    ours[k].append(a[k])
                    peer[k].append(b[k])
                print(f"  {name} t={t} rep {r + 1}: lumen pp {a['pp']:.1f} tg {a['tg']:.1f} | "
                      f"llama.cpp pp {b['pp']:.1f} tg {b['tg']:.1f}", file=sys.stderr, flush=True)
            med = {k: (statistics.median(ours[k]), statistics.median(peer[k])) for k in ours}
            ratio = {k: med[k][0] / med[k][1] if med[k][1] > 0 else 0.0 for k in med}
            rows.append({
                "model": name, "threads": t, "read_gb_per_s": bw, "weight_bytes": wbytes,
                "pp_lumen": med["pp"][0], "pp_llama": med["pp"][1], "pp_ratio": ratio["pp"],
                "tg_lumen": med["tg"][0], "tg_llama": med["tg"][1], "tg_ratio": ratio["tg"],
                "tg_bw_fraction_lumen": wbytes * med["tg"][0] / (bw * 1e9),
                "tg_bw_fraction_llama": wbytes * med["tg"][1] / (bw * 1e9),
            })

    print(f"\nLumen vs llama.cpp ({LLAMA_CPP_PYTHON.split('==')[0]} {version}), CPU, pp{args.pp} / tg{args.tg}, "
          f"medians of {args.reps} alternating runs, {platform.node()} {time.strftime('%Y-%m-%d')}")
    print(f"{'model':<20} {'thr':>3} {'pp lumen':>9} {'pp llama':>9} {'ratio':>6} {'tg lumen':>9} {'tg llama':>9} "
          f"{'ratio':>6} {'tg % of BW limit (lumen/llama)':>31}")
    for r in rows:
        print(f"{r['model']:<20} {r['threads']:>3} {r['pp_lumen']:>9.1f} {r['pp_llama']:>9.1f} {r['pp_ratio']:>6.2f} "
              f"{r['tg_lumen']:>9.1f} {r['tg_llama']:>9.1f} {r['tg_ratio']:>6.2f} "
              f"{100 * r['tg_bw_fraction_lumen']:>14.1f}% / {100 * r['tg_bw_fraction_llama']:.1f}% "
              f"({r['read_gb_per_s']:.1f} GB/s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"llama_cpp_python": version, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
