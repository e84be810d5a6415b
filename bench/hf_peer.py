#!/usr/bin/env python3
"""Hugging Face transformers as the peer of `lumen bench --parallel` on the same
Hugging Face folder (bench/bench_make_model.c writes one; bf16 weights).

Measures, on one GPU:
  - prefill: one forward pass over a --pp-token prompt (batch 1, logits of the last
    token only), tokens/s, median of --reps;
  - decode: for each batch size B, model.generate with a static KV cache
    (cache_implementation="static"), greedy, --prompt-token prompts, --gen new tokens.
    The decode rate is B * (gen - 1) / time between the first and the last generated
    token, timed by CUDA events recorded from a logits processor (no extra
    synchronization), so the prompt's prefill is excluded, as in `lumen bench`.

Compilation: transformers compiles the decode step by itself when the cache is
static and the model is on a GPU (torch.compile, mode "reduce-overhead": CUDA graphs).
--compile auto keeps that (the first call of each batch size pays the compile,
reported as compile_s, and is not timed); --compile off passes disable_compile=True
(eager PyTorch). With --budget-s, batch sizes that would not fit the time left are
skipped (the order of --batches is the priority order).

Results go to stdout as one JSON object, and to --json PATH after every measurement
(so a run cut short still leaves what it measured).

  python3 bench/hf_peer.py /tmp/qwen-bf16 --batches 1,64,8,256 --json out.json
"""
import argparse
import json
import os
import statistics
import sys
import time


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="Hugging Face folder (config.json + safetensors)")
    ap.add_argument("--batches", default="1,64,8,256", help="decode batch sizes, in priority order")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens per sequence for decode")
    ap.add_argument("--gen", type=int, default=128, help="tokens generated per sequence")
    ap.add_argument("--pp", type=int, default=512, help="prefill prompt tokens (0: skip)")
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions (medians)")
    ap.add_argument("--compile", choices=["auto", "off"], default="auto")
    ap.add_argument("--budget-s", type=float, default=0, help="stop starting measurements after this (0: no limit)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--json", help="also write the JSON here after every measurement")
    a = ap.parse_args()
    t_start = time.perf_counter()

    def left():
        return a.budget_s - (time.perf_counter() - t_start) if a.budget_s > 0 else float("inf")

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList

    res = {
        "peer": "transformers",
        "model": a.model,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dtype": a.dtype,
        "compile": a.compile,
        "prompt": a.prompt,
        "gen": a.gen,
        "reps": a.reps,
        "decode": [],
    }

    def save():
        if a.json:
            tmp = a.json + ".tmp"
            with open(tmp, "w") as f:
                json.dump(res, f, indent=1)
            os.replace(tmp, a.json)

    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    if cuda:
        res["gpu"] = torch.cuda.get_device_name(dev)
    dtype = getattr(torch, a.dtype)
    t0 = time.perf_counter()
    try:
        model = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype)
    except TypeError:  # transformers 4.x spells it torch_dtype
        model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=dtype)
    model = model.to(dev).eval()
    model.generation_config.eos_token_id = None  # random weights: never stop early
    model.generation_config.pad_token_id = 0
    res["load_s"] = time.perf_counter() - t0
    res["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
    res["weight_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    vocab = model.config.vocab_size
    log(f"hf_peer: loaded in {res['load_s']:.1f} s, {res['weight_bytes'] / 1e9:.2f} GB of weights, "
        f"attention {res['attn_implementation']}")
    save()
    gen = torch.Generator().manual_seed(1234)

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    # ---- prefill -------------------------------------------------------------
    if a.pp > 0:
        ids = torch.randint(0, vocab, (1, a.pp), generator=gen).to(dev)
        try:
            with torch.inference_mode():
                times = []
                for i in range(2 + a.reps):
                    sync()
                    t = time.perf_counter()
                    out = model(input_ids=ids, use_cache=False, logits_to_keep=1)
                    sync()
                    if i >= 2:
                        times.append(time.perf_counter() - t)
                    del out
            res["prefill"] = {"tokens": a.pp, "tokens_per_s": a.pp / statistics.median(times),
                              "ms": 1e3 * statistics.median(times)}
            log(f"hf_peer: prefill {a.pp}: {res['prefill']['tokens_per_s']:.0f} tokens/s")
        except Exception as e:  # keep going: the decode numbers are still worth having
            res["prefill"] = {"tokens": a.pp, "error": repr(e)[:300]}
            log(f"hf_peer: prefill failed: {e!r}")
        save()

    # ---- decode --------------------------------------------------------------
    class StepClock(LogitsProcessor):
        """Marks the stream after each step's logits: the time between the first and
        the last mark is the decode time of gen - 1 steps."""

        def __init__(self):
            self.marks = []

        def __call__(self, input_ids, scores):
            if cuda:
                e = torch.cuda.Event(enable_timing=True)
                e.record()
                self.marks.append(e)
            else:
                self.marks.append(time.perf_counter())
            return scores

        def seconds(self):
            if len(self.marks) < 2:
                return float("nan")
            if cuda:
                self.marks[-1].synchronize()
                return self.marks[0].elapsed_time(self.marks[-1]) / 1e3
            return self.marks[-1] - self.marks[0]

    eager = a.compile == "off"

    def generate_once(ids, mask):
        clock = StepClock()
        kw = dict(max_new_tokens=a.gen, do_sample=False, cache_implementation="static",
                  logits_processor=LogitsProcessorList([clock]), pad_token_id=0)
        if eager:
            kw["disable_compile"] = True
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, **kw)
        sync()
        n_new = out.shape[1] - ids.shape[1]
        return clock.seconds(), n_new

    batches = [int(b) for b in a.batches.split(",") if b]
    est_per_batch = None  # seconds the last batch size took, all in
    for B in batches:
        if est_per_batch is not None and left() < est_per_batch * 1.3:
            res["decode"].append({"batch": B, "skipped": f"time budget ({left():.0f} s left)"})
            log(f"hf_peer: batch {B} skipped: {left():.0f} s left")
            save()
            continue
        tb = time.perf_counter()
        entry = {"batch": B}
        try:
            ids = torch.randint(0, vocab, (B, a.prompt), generator=gen).to(dev)
            mask = torch.ones_like(ids)
            t = time.perf_counter()
            try:
                generate_once(ids, mask)  # warm-up (compiles when --compile auto)
            except Exception as e:
                if eager:
                    raise
                # compilation failed: say so, and measure eager PyTorch from here on
                log(f"hf_peer: compiled generate failed ({e!r}); eager from now on")
                res["compile_error"] = repr(e)[:300]
                eager = True
                generate_once(ids, mask)
            entry["first_call_s"] = time.perf_counter() - t
            entry["mode"] = "eager" if eager else ("compiled" if cuda and hasattr(model, "_compiled_call") else "auto")
            rates, n_new = [], 0
            for _ in range(a.reps):
                if rates and left() < 0:
                    break
                s, n_new = generate_once(ids, mask)
                rates.append(B * (n_new - 1) / s)
            entry.update({"tokens_per_s": statistics.median(rates), "step_ms": 1e3 * B / statistics.median(rates),
                          "generated": n_new, "runs": len(rates)})
            if n_new != a.gen:
                entry["warning"] = f"generated {n_new} tokens, not {a.gen}"
            if cuda:
                entry["peak_gib"] = torch.cuda.max_memory_allocated(dev) / 2**30
            log(f"hf_peer: batch {B}: {entry['tokens_per_s']:.0f} tokens/s ({entry['step_ms']:.2f} ms/step), "
                f"first call {entry['first_call_s']:.1f} s")
        except Exception as e:
            entry["error"] = repr(e)[:300]
            log(f"hf_peer: batch {B} failed: {e!r}")
            if cuda:
                torch.cuda.empty_cache()
        est_per_batch = time.perf_counter() - tb
        res["decode"].append(entry)
        save()
    res["total_s"] = time.perf_counter() - t_start
    save()
    print(json.dumps(res))


if __name__ == "__main__":
    main()
