#!/usr/bin/env python3
"""The table of bench/cuda_bench_run.sh: Lumen (Q4_K_M-like GGUF, bf16 folder) and
Hugging Face transformers on the same Qwen2.5-1.5B-shaped weights, each figure with
its fraction of the machine's limit.

  decode  (weight bytes + KV-cache bytes read per step) * steps/s / copy ceiling,
          where the copy ceiling is the measured device-to-device copy rate
          (bytes read + written; the practical HBM limit, below the 4.8 TB/s
          nominal). KV bytes per step: N sequences * (prompt + gen/2) average
          positions * layers * 2 (K, V) * kv_heads * head_dim * 2 bytes (F16/bf16).
          The weights-only fraction is in the JSON too.
  prefill FLOPs per token (2 * non-embedding matrix parameters + causal attention
          4 * layers * heads * head_dim * (P + 1) / 2 + the head for one token / P)
          * tokens/s / 790 TFLOP/s (bf16 dense matrix products measured on the H200).

Only the standard library; every input may be missing (that column reads "-").
  python3 bench/cuda_bench_table.py --config DIR/config.json --lumen-q4 a.json
      --lumen-bf16 b.json --hf c.json --copy-gbs 4225 [--summary out.json]
"""
import argparse
import json
import os
import sys

TFLOPS_BF16 = 790e12
QWEN25_15B = {"num_hidden_layers": 28, "hidden_size": 1536, "num_attention_heads": 12, "num_key_value_heads": 2,
              "head_dim": 128, "intermediate_size": 8960, "vocab_size": 151936}
NOMINAL_HBM = 4.8e12
# measured earlier on the same machine (/work/shared/GPU-MACHINE.md), same shapes and work
EARLIER = [
    ("llama.cpp CUDA f16 (earlier)", {"pp": 37900, 1: 374, 64: 12035, 256: 21497}),
    ("llama.cpp CUDA Q4_K_M (earlier)", {1: 425}),
    ("transformers static (earlier)", {"pp": 16428, 1: 271, 64: 10479}),
]
TARGETS = ("issue 7 targets", {"pp": 60000, 1: "1000 bf16 / 1500 Q4", 64: 30000, 256: 60000})


def load(path):
    if not path or not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            txt = f.read().strip()
        try:
            return json.loads(txt)
        except ValueError:  # lumen bench --json prints one line; tolerate log lines before it
            for line in reversed(txt.splitlines()):
                if line.strip().startswith("{"):
                    return json.loads(line)
    except (OSError, ValueError):
        pass
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", help="the model's config.json (default: Qwen2.5-1.5B's shape)")
    ap.add_argument("--lumen-q4")
    ap.add_argument("--lumen-bf16")
    ap.add_argument("--lumen-bf16-last", help="lumen bench --logits last (optional)")
    ap.add_argument("--lumen-q4-greedy", help="lumen bench --logits greedy on the GGUF (optional)")
    ap.add_argument("--lumen-bf16-greedy", help="lumen bench --logits greedy on the bf16 folder (optional)")
    ap.add_argument("--hf")
    ap.add_argument("--copy-gbs", type=float, default=0, help="measured device copy rate, GB/s")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--batches", default="1,8,64,256")
    ap.add_argument("--summary", help="write the rows as JSON here")
    a = ap.parse_args()

    c = load(a.config) or QWEN25_15B
    L, d, H = c["num_hidden_layers"], c["hidden_size"], c["num_attention_heads"]
    Hkv = c.get("num_key_value_heads", H)
    hd = c.get("head_dim", d // H)
    ff, V = c["intermediate_size"], c["vocab_size"]
    mat = L * (d * H * hd + 2 * d * Hkv * hd + H * hd * d + 3 * d * ff)
    P = a.pp
    flops_tok = 2 * mat + 4 * L * H * hd * (P + 1) / 2 + 2 * d * V / max(P, 1)
    kv_tok = L * 2 * Hkv * hd * 2
    avg_ctx = a.prompt + a.gen / 2
    ceiling = a.copy_gbs * 1e9 if a.copy_gbs > 0 else NOMINAL_HBM
    batches = [int(b) for b in a.batches.split(",")]

    rows = []

    def lumen_row(name, path):
        j = None
        if path and os.path.exists(path):  # one JSON line per lumen bench call: merge them
            for line in open(path):
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    part = json.loads(line)
                except ValueError:
                    continue
                if j is None:
                    j = part
                else:
                    j["parallel"] = j.get("parallel", []) + part.get("parallel", [])
                    if not j.get("pp_tokens_per_s"):
                        j["pp_tokens_per_s"] = part.get("pp_tokens_per_s")
        if not j:
            return {"name": name, "missing": True}
        r = {"name": name, "weight_bytes": j.get("weight_bytes", 0), "pp": j.get("pp_tokens_per_s") or None}
        for e in j.get("parallel", []):
            r[e["n_seqs"]] = e.get("decode_tokens_per_s") if "error" not in e else None
            if "error" in e:
                r.setdefault("errors", {})[e["n_seqs"]] = e["error"]
        return r

    rows.append(lumen_row("Lumen CUDA, Q4_K_M-like GGUF", a.lumen_q4))
    rows.append(lumen_row("Lumen CUDA, bf16 folder", a.lumen_bf16))
    if a.lumen_bf16_last:
        rows.append(lumen_row("Lumen CUDA, bf16, last logits only", a.lumen_bf16_last))
    for name, path in (("Lumen CUDA, Q4_K_M-like, greedy", a.lumen_q4_greedy),
                       ("Lumen CUDA, bf16, greedy", a.lumen_bf16_greedy)):
        if path and os.path.exists(path):
            rows.append(lumen_row(name, path))
    hf = load(a.hf)
    if hf:
        r = {"name": "transformers (static cache%s)" % (", compiled" if any(
            e.get("mode") == "compiled" for e in hf.get("decode", [])) else ""),
             "weight_bytes": hf.get("weight_bytes", 0)}
        p = hf.get("prefill") or {}
        r["pp"] = p.get("tokens_per_s")
        for e in hf.get("decode", []):
            r[e["batch"]] = e.get("tokens_per_s")
            if e.get("mode"):
                r.setdefault("modes", {})[e["batch"]] = e["mode"]
        rows.append(r)
    else:
        rows.append({"name": "transformers (static cache)", "missing": True})

    def frac_decode(r, n, tps):
        wb = r.get("weight_bytes") or 0
        if not tps or not wb:
            return None, None
        steps = tps / n
        return (wb + n * avg_ctx * kv_tok) * steps / ceiling, wb * steps / ceiling

    def cell(v, f=None):
        if v is None:
            return "-"
        if isinstance(v, str):
            return v
        s = f"{v:,.0f}"
        return s + (f" ({100 * f:.0f}%)" if f is not None else "")

    head = ["engine", f"pp{P} tok/s"] + [f"decode x{n} tok/s" for n in batches]
    table = []
    for r in rows:
        if r.get("missing"):
            table.append([r["name"], "not run"] + [""] * len(batches))
            continue
        line = [r["name"], cell(r.get("pp"), (r["pp"] * flops_tok / TFLOPS_BF16) if r.get("pp") else None)]
        r["fractions"] = {}
        if r.get("pp"):
            r["fractions"]["pp"] = r["pp"] * flops_tok / TFLOPS_BF16
        for n in batches:
            f, fw = frac_decode(r, n, r.get(n))
            line.append(cell(r.get(n), f))
            if f is not None:
                r["fractions"][n] = {"weights_and_kv": f, "weights_only": fw}
        table.append(line)
    for name, vals in EARLIER + [TARGETS]:
        table.append([name, cell(vals.get("pp"))] + [cell(vals.get(n)) for n in batches])

    widths = [max(len(str(t[i])) for t in [head] + table) for i in range(len(head))]
    fmt = lambda t: "  ".join(str(x).ljust(widths[0]) if i == 0 else str(x).rjust(widths[i])
                               for i, x in enumerate(t))
    print(fmt(head))
    print("  ".join("-" * w for w in widths))
    for t in table:
        print(fmt(t))
    print()
    print(f"shape: {L} layers, d {d}, {H}/{Hkv} heads x {hd}, ffn {ff}, vocab {V}; decode: {a.prompt}-token prompts, "
          f"{a.gen} generated, aggregate tokens/s over all sequences")
    print(f"(%) prefill: of {TFLOPS_BF16 / 1e12:.0f} TFLOP/s bf16 at {flops_tok / 1e9:.2f} GFLOP/token; decode: "
          f"(weights + KV read per step) x steps/s of the "
          + (f"measured device copy rate {a.copy_gbs:,.0f} GB/s" if a.copy_gbs > 0 else
             f"nominal {NOMINAL_HBM / 1e12:.1f} TB/s (no copy measurement)")
          + f" (nominal HBM {NOMINAL_HBM / 1e12:.1f} TB/s); KV {kv_tok} bytes/position, {avg_ctx:.0f} positions "
          "on average")
    for r in rows:
        if r.get("weight_bytes"):
            print(f"  {r['name']}: {r['weight_bytes'] / 1e9:.3f} GB of weights read per step")
        for n, e in (r.get("errors") or {}).items():
            print(f"  {r['name']} x{n}: {e}")
        if r.get("modes"):
            print(f"  {r['name']}: " + ", ".join(f"x{n} {m}" for n, m in r["modes"].items()))
    if hf and hf.get("compile_error"):
        print(f"  transformers: compilation failed, eager numbers: {hf['compile_error']}")
    if a.summary:
        with open(a.summary, "w") as f:
            json.dump({"rows": rows, "flops_per_token": flops_tok, "kv_bytes_per_position": kv_tok,
                       "copy_gbs": a.copy_gbs, "tflops_bf16": TFLOPS_BF16 / 1e12}, f, indent=1, default=str)


if __name__ == "__main__":
    sys.exit(main())
