#!/usr/bin/env python3
"""Lumen's tokenizer against llama.cpp's (llama-cpp-python) on the same vocabulary and text.

The text is the 1 MiB mixed text that bench_tokenizer generates (written out with --dump).
Runs alternate: one lumen run (a bench_tokenizer process timing encode only, not loading),
then one llama.cpp run (Llama(vocab_only=True).tokenize, loaded once, encode only), R times.
Reports both medians, the ratio (llama.cpp time / lumen time: > 1 means lumen is faster), and
whether the token counts agree.

usage: /work/dl/venv/bin/python bench/compare_tokenizer.py [--bench PATH] [--runs R] [--special]
                                                           [MODEL.gguf ...]
Without models: the three real models under ~/.cache/lumen/models (those pulled).
"""
import argparse
import glob
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def find_bench():
    for d in ("build-tok2", "build", "build-release"):
        p = os.path.join(ROOT, d, "bench_tokenizer")
        if os.path.exists(p):
            return p
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*")
    ap.add_argument("--bench", default=find_bench())
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--special", action="store_true", help="parse special tokens (both sides)")
    args = ap.parse_args()
    if not args.bench:
        sys.exit("bench_tokenizer not built (cmake --build BUILD --target bench_tokenizer)")
    models = args.models or [g for n in ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-1.5b")
                             for g in sorted(glob.glob(os.path.expanduser(f"~/.cache/lumen/models/{n}/*.gguf")))[:1]]
    if not models:
        sys.exit("no models")

    import llama_cpp
    from llama_cpp import Llama

    with tempfile.TemporaryDirectory() as tmp:
        text_path = os.path.join(tmp, "text.txt")
        subprocess.run([args.bench, "--dump", text_path], check=True)
        text = open(text_path, "rb").read()
        print(f"text: {len(text)} bytes; llama-cpp-python {llama_cpp.__version__}; {args.runs} alternating runs")
        print(f"{'model':<45} {'lumen s':>9} {'llama.cpp s':>12} {'ratio':>7} {'lumen MB/s':>11} {'tokens':>9} agree")
        for model in models:
            llm = Llama(model_path=model, vocab_only=True, verbose=False)
            ours, theirs = [], []
            n_ours = n_theirs = None
            for _ in range(args.runs):
                cmd = [args.bench, "--runs", "1", "--text", text_path, model] + (["--special"] if args.special else [])
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                m = re.search(r"tokens=(\d+) median_s=([0-9.]+)", out)
                n_ours = int(m.group(1))
                ours.append(float(m.group(2)))
                t0 = time.perf_counter()
                ids = llm.tokenize(text, add_bos=False, special=args.special)
                theirs.append(time.perf_counter() - t0)
                n_theirs = len(ids)
            mo, mt = statistics.median(ours), statistics.median(theirs)
            print(f"{os.path.basename(model):<45} {mo:9.4f} {mt:12.4f} {mt / mo:7.2f} {len(text) / mo / 1e6:11.2f} "
                  f"{n_ours:>9} {'yes' if n_ours == n_theirs else f'NO ({n_theirs})'}")
            del llm


if __name__ == "__main__":
    main()
