#!/usr/bin/env python3
"""Write tests/golden/<model>.json: llama.cpp's logits and greedy continuations for real
models, the reference the C forward pass is tested against (docs/GOLDEN.md).

Runs llama.cpp through llama-cpp-python (a venv with llama-cpp-python and numpy; jinja2
comes with it). For each model:

  sequences  fixed texts tokenized with the model's own tokenizer (BOS as the model asks),
             each evaluated in one fresh context; for every position the log-sum-exp of the
             full logit row (float64) and the top-K (token id, logit) pairs, descending.
  greedy     chat-formatted questions, continued greedily (argmax of llama.cpp's logits,
             lowest id on ties) for a fixed number of steps, never stopping at EOS; for each
             step the gap between the top-1 and top-2 logits.

usage: make_golden.py [--models NAME ...] [--out DIR] [--lumen-home DIR]
Models come from the lumen pull cache ($LUMEN_HOME/models/<name>/<file>).
"""

import argparse
import subprocess
import datetime
import hashlib
import json
import os
import platform
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import lumen_pull  # noqa: E402  (catalog: file names, sizes, pinned hashes)

import llama_cpp  # noqa: E402
import llama_cpp.llama_cpp as llama_capi  # noqa: E402

# No "extra buffer types": those are ggml's AMX matmul (its tile loads fault with SIGILL on
# the VMs this project runs on, though the CPU advertises AMX) and the weight repacking into
# interleaved blocks. Without them every matmul takes ggml-cpu's plain quantized dot
# products, which is also the path that is the same on every x86-64 machine. The Llama
# class has no parameter for it, so its default model params are patched.
_default_model_params = llama_capi.llama_model_default_params


def _model_params_without_extra_bufts():
    params = _default_model_params()
    params.use_extra_bufts = False
    return params


llama_capi.llama_model_default_params = _model_params_without_extra_bufts

FORMAT = "lumen-golden-1"
TOP_K = 40
GREEDY_STEPS = 64
SETTINGS = dict(n_ctx=2048, n_batch=2048, n_threads=2, n_threads_batch=2, seed=0,
                logits_all=True, n_gpu_layers=0)
# The llama.cpp tree vendored by llama-cpp-python 0.3.36 (read from its source archive;
# the library does not expose its commit at run time).
LLAMA_CPP_COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"

# ---------------------------------------------------------------- fixed inputs
# Written for this project. The prose is long enough for ~720 Gemma tokens, so that
# positions past Gemma 3's 512-token sliding window are covered.

PROSE = """\
The lighthouse keeper kept a notebook on the table by the stairs, and every evening he \
wrote three things in it: the direction of the wind, the colour of the sea, and the name \
of one ship he had seen that day. Most of the entries were dull. The wind came from the \
west more often than not, the sea was grey, and the ships were the same fishing boats that \
left the harbour before dawn and came back, heavier, in the early afternoon. But he kept \
writing, because the notebook was older than he was, and the keepers before him had kept \
it the same way, in the same careful hand, for nearly ninety years.

One winter the supply boat did not come. The storms had started in November and did not \
stop; the waves climbed the rocks and broke against the lower windows, and the radio gave \
nothing but static for days at a time. He rationed the oil for the lamp, then the food, \
then the candles he used to read by. In the long dark afternoons he read the old notebook \
from the beginning, and slowly he began to notice patterns that no single keeper could \
have seen. The grey seas came in runs of eleven or twelve days. The fishing fleet shrank \
every decade, then grew again after each war. A ship called the Marguerite appeared in \
the entries of four different keepers, always in late March, always heading north.

When the storms finally broke, in the second week of February, he climbed to the gallery \
and watched the horizon for the supply boat. It came the next morning, low in the water, \
with a young woman at the wheel whom he had never met. She explained that the old skipper \
had retired and that she would be making the run from now on, weather permitting. He \
thanked her, carried the crates up the stairs one at a time, and asked whether she had \
ever heard of a ship called the Marguerite. She laughed and said that it was her \
grandmother's boat, that it still went north every spring to fetch wool from the islands, \
and that it would pass the lighthouse again in a few weeks.

That evening he opened the notebook and wrote the wind, the sea and the ship, as always. \
Then, for the first time in the history of the light, he added a fourth line: a short \
note about the woman on the supply boat, and the grandmother, and the wool. It seemed to \
him that a record of ships was not really about ships at all. It was about who was out \
there on the water, and who was watching for them, and how long the watching had gone on. \
In March, right on time, the Marguerite came round the point under a pale sky, and he \
waved from the gallery until she was only a speck against the northern headland. The \
next keeper, he decided, should know to look for her; so he underlined the entry twice, \
and left a note in the margin that said simply: late March, heading north, wave back.

Years later, when the light was automated and the keepers' cottage became a small museum, the notebook was put in a glass case near the door. Visitors tended to skim the pages of wind and weather and stop at the line about the woman on the supply boat. Some of them asked the guide whether the Marguerite still sailed. The guide, who had grown up in the village, would point through the window at the water and say that it did, though the boat had been rebuilt twice and now carried tourists as well as wool. Every spring, she added, somebody in the museum went up to the gallery in the last week of March, just to see it pass, and to wave, because that was what the notebook said to do.
"""

CODE = '''\
#include <stddef.h>
#include <stdint.h>

/* Fowler-Noll-Vo hash of a byte buffer (FNV-1a, 64-bit). */
static uint64_t fnv1a64(const void *data, size_t n) {
    const uint8_t *p = (const uint8_t *)data;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

def merge_intervals(intervals):
    """Merge overlapping [start, end] pairs; returns a new sorted list."""
    out = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return out

print(merge_intervals([[1, 3], [2, 6], [8, 10], [15, 18]]))  # [[1, 6], [8, 10], [15, 18]]
'''

MIXED = """\
Invoice #2024-0917 — total: €1,234.56 (incl. 21% VAT); paid on 03/11/2024 at 14:05 UTC.
Temperatures: −3.5°C → 27.25°C; π ≈ 3.14159, e ≈ 2.71828, √2 ≈ 1.41421.
Café, naïve, façade, Zürich, São Paulo, Kraków; 東京 (Tokyo), 北京 (Beijing), Москва.
Emoji: 🙂🚀✨ — quotes: «bonjour», „hallo“, 'single', "double"; tab:\tend.
Math: (a+b)^2 = a^2 + 2ab + b^2; 10**6 == 1_000_000; x != y && y <= z || !w.
URL: https://example.org/path?q=a%20b&n=42#frag; e-mail: someone@example.com; ~/.cache/lumen
"""

QUESTIONS = [
    ("capital", "What is the capital of France? Answer in one sentence."),
    ("c_max", "Write a C function that returns the larger of two integers."),
    ("primes", "List three prime numbers greater than 20, separated by commas."),
]

# Per-model plan: how many tokens of the prose to keep, and how to build the chat prompt.
MODELS = {
    "smollm2-135m": dict(prose_tokens=400, chat="template"),
    # A base (pretrained) model: its chat-format continuations degenerate, so it also gets
    # a plain-text prompt whose continuation is ordinary prose.
    "gemma3-270m": dict(prose_tokens=720, chat="gemma",
                        plain=[("plain", "The three largest cities in France are")]),
    "qwen2.5-coder-1.5b": dict(prose_tokens=400, chat="template"),
}
DEFAULT_MODELS = list(MODELS)


# ---------------------------------------------------------------- helpers

def f32(x):
    """The float32 value as the shortest decimal that round-trips it (JSON-friendly)."""
    return float(str(np.float32(x)))


def lse64(row):
    r = row.astype(np.float64)
    m = r.max()
    return float(m + np.log(np.exp(r - m).sum()))


def top_k(row, k):
    idx = np.argpartition(-row, k)[:k]
    # Descending by logit; ties broken by the lower token id, so the order is reproducible.
    order = np.lexsort((idx, -row[idx]))
    idx = idx[order]
    return [[int(i), f32(row[i])] for i in idx]


def argmax_and_gap(row):
    top = top_k(row, 2)
    return top[0][0], float(np.float32(top[0][1]) - np.float32(top[1][1])), top[1][0]


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def render_chat_template(template, messages, bos_token, eos_token):
    """Render a Hugging Face style chat template with jinja2, as transformers does."""
    import jinja2
    import jinja2.sandbox

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    def tojson(x, indent=None, ensure_ascii=False, sort_keys=False):
        return json.dumps(x, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(
        messages=messages, add_generation_prompt=True, bos_token=bos_token,
        eos_token=eos_token)


def gemma_turns(messages):
    # Gemma's turn format; the BOS comes from the tokenizer (add_bos_token is true).
    out = []
    for m in messages:
        role = "model" if m["role"] == "assistant" else m["role"]
        out.append(f"<start_of_turn>{role}\n{m['content']}<end_of_turn>\n")
    return "".join(out) + "<start_of_turn>model\n"


# ---------------------------------------------------------------- JSON layout
# Leaf arrays (token ids, one position's top-K) stay on one line; the file stays readable
# and diffs line by line.

def _inline(obj):
    """Scalars, lists of scalars and lists of such lists go on one line."""
    if isinstance(obj, dict):
        return False
    if isinstance(obj, list):
        return all(not isinstance(x, (list, dict)) or
                   (isinstance(x, list) and all(not isinstance(y, (list, dict)) for y in x))
                   for x in obj)
    return True


def dump(obj, f, indent=0):
    pad = " " * indent
    if _inline(obj):
        f.write(json.dumps(obj, separators=(",", ":"), ensure_ascii=False))
        return
    if isinstance(obj, dict):
        items, open_, close = list(obj.items()), "{", "}"
    else:
        items, open_, close = [(None, v) for v in obj], "[", "]"
    f.write(open_ + "\n")
    for i, (k, v) in enumerate(items):
        f.write(pad + "  " + (json.dumps(k) + ": " if k is not None else ""))
        dump(v, f, indent + 2)
        f.write(",\n" if i + 1 < len(items) else "\n")
    f.write(pad + close)


# ---------------------------------------------------------------- per model

def f32_path(home, name):
    """Where the golden test and this script keep the F32 copy of a pulled model."""
    return os.path.join(home, "derived", f"{name}-f32.gguf")


def run_model(name, home, out_dir, lumen_bin=None):
    entry = lumen_pull.CATALOG[name]
    plan = MODELS[name]
    path = os.path.join(home, "models", name, entry["file"])
    if not os.path.exists(path):
        sys.exit(f"make_golden: {path} is missing; run: lumen pull {name}")
    digest = sha256_file(path)
    if digest != entry["sha256"]:
        sys.exit(f"make_golden: {path} has sha256 {digest}, expected {entry['sha256']}")

    # The F32 variant: the same weights exactly dequantized (`lumen convert --dtype f32`)
    # and an F32 KV cache, so llama.cpp computes without quantizing activations. Its
    # logits are the exact math up to summation order: a reference with no noise floor.
    settings_extra, derived_from, out_name = {}, None, name
    if lumen_bin:
        src, path = path, f32_path(home, name)
        if not os.path.exists(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            subprocess.run([lumen_bin, "convert", src, path, "--dtype", "f32"], check=True)
        derived_from = {"file": entry["file"], "sha256": digest,
                        "conversion": "lumen convert --dtype f32"}
        digest = sha256_file(path)
        settings_extra = dict(type_k=0, type_v=0)  # GGML_TYPE_F32
        out_name = f"{name}-f32"

    t0 = time.monotonic()
    llm = llama_cpp.Llama(model_path=path, verbose=False, **SETTINGS, **settings_extra)
    t_load = time.monotonic() - t0
    cp = llm.context_params
    vocab = llm._model.vocab
    n_vocab = llm.n_vocab()
    meta = llm.metadata
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(vocab))
    bos, eos = llm.token_bos(), llm.token_eos()

    def tokenize(text, special):
        # add_bos=True means "add the model's special prefix tokens if it wants them".
        return llm.tokenize(text.encode("utf-8"), add_bos=True, special=special)

    def eval_fresh(tokens):
        llm.reset()
        llm.eval(tokens)
        return np.asarray(llm.scores[:len(tokens)], dtype=np.float32)

    # -- sequences
    texts = [("prose", PROSE, plan["prose_tokens"]), ("code", CODE, None), ("mixed", MIXED, None)]
    sequences = []
    t1 = time.monotonic()
    for sname, text, cut in texts:
        toks = tokenize(text, special=False)
        if cut is not None:
            if len(toks) < cut:
                sys.exit(f"make_golden: {name}: the prose gives only {len(toks)} tokens, "
                         f"need {cut}")
            toks = toks[:cut]
        logits = eval_fresh(toks)
        sequences.append({
            "name": sname,
            "text": text,
            "truncated_to": cut,
            "n_tokens": len(toks),
            "tokens": [int(t) for t in toks],
            "lse": [lse64(row) for row in logits],
            "top": [top_k(row, TOP_K) for row in logits],
        })
        print(f"  {name}: sequence {sname}: {len(toks)} tokens", file=sys.stderr, flush=True)
    t_seq = time.monotonic() - t1

    # -- greedy
    greedy = []
    t2 = time.monotonic()
    tmpl = meta.get("tokenizer.chat_template")
    prompts = [(g, q, True) for g, q in QUESTIONS] + [(g, t, False) for g, t in plan.get("plain", [])]
    for gname, question, chat in prompts:
        messages = [{"role": "user", "content": question}] if chat else None
        if not chat:
            prompt_text = question
            prompt_source = "plain text, no chat format"
        elif plan["chat"] == "template":
            if not tmpl:
                sys.exit(f"make_golden: {name} has no tokenizer.chat_template")
            prompt_text = render_chat_template(tmpl, messages,
                                               llm.detokenize([bos], special=True).decode(),
                                               llm.detokenize([eos], special=True).decode())
            prompt_source = "tokenizer.chat_template (jinja2)"
        else:
            prompt_text = gemma_turns(messages)
            prompt_source = "Gemma turn format written by hand (the GGUF has no chat template)"
        prompt = tokenize(prompt_text, special=chat)
        if len(prompt) >= 2 and prompt[0] == prompt[1] == bos:
            sys.exit(f"make_golden: {name}: double BOS in the chat prompt")
        llm.reset()
        llm.eval(prompt)
        gen, gaps, second, eog_steps = [], [], [], []
        for step in range(GREEDY_STEPS):
            row = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            tok, gap, tok2 = argmax_and_gap(row)
            gen.append(tok)
            gaps.append(round(gap, 6))
            second.append(tok2)
            if llama_cpp.llama_vocab_is_eog(vocab, tok):
                eog_steps.append(step)
            llm.eval([tok])
        greedy.append({
            "name": gname,
            "messages": messages,
            "prompt_source": prompt_source,
            "prompt_text": prompt_text,
            "prompt_tokens": [int(t) for t in prompt],
            "n_steps": GREEDY_STEPS,
            "stops_at_eos": False,
            "generated": gen,
            "second": second,
            "gaps": gaps,
            "eog_steps": eog_steps,
            "generated_text": llm.detokenize(gen).decode("utf-8", "replace"),
        })
        print(f"  {name}: greedy {gname}: prompt {len(prompt)} tokens, min gap "
              f"{min(gaps):.4f}, eog at {eog_steps}", file=sys.stderr, flush=True)
    t_greedy = time.monotonic() - t2

    settings = dict(SETTINGS)
    settings.update({
        "n_ubatch": int(cp.n_ubatch),
        "flash_attn": (llama_cpp.llama_flash_attn_type_name(cp.flash_attn_type) or b"").decode(),
        "type_k": "f16" if cp.type_k == 1 else int(cp.type_k),
        "type_v": "f16" if cp.type_v == 1 else int(cp.type_v),
        "swa_full": bool(cp.swa_full),
        "kv_unified": bool(cp.kv_unified),
        "offload_kqv": bool(cp.offload_kqv),
        "rope_scaling": "model default",
        "use_mmap": True,
        "use_extra_bufts": bool(llm.model_params.use_extra_bufts),
        "eval": "llm.reset(); llm.eval(tokens); logits from llm.scores (float32)",
    })
    doc = {
        "format": FORMAT,
        "model": name,
        "variant": "f32" if derived_from else "quantized",
        "derived_from": derived_from,
        "gguf_file": os.path.basename(path),
        "gguf_size": os.path.getsize(path),
        "gguf_sha256": digest,
        "general_name": meta.get("general.name"),
        "architecture": meta.get("general.architecture"),
        "n_vocab": n_vocab,
        "bos": int(bos),
        "eos": int(eos),
        "add_bos": add_bos,
        "top_k": TOP_K,
        "generator": {
            "script": "scripts/make_golden.py",
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "llama_cpp_python": llama_cpp.__version__,
            "llama_cpp_commit": LLAMA_CPP_COMMIT,
            "system_info": llama_cpp.llama_print_system_info().decode().strip(),
            "numpy": np.__version__,
            "python": platform.python_version(),
            "machine": platform.machine(),
        },
        "settings": settings,
        "timing_s": {"load": round(t_load, 2), "sequences": round(t_seq, 2),
                     "greedy": round(t_greedy, 2)},
        "sequences": sequences,
        "greedy": greedy,
    }
    llm.close()

    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, f"{out_name}.json")
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        dump(doc, f)
        f.write("\n")
    os.replace(tmp, out)
    total = time.monotonic() - t0
    print(f"{name}: {total:.1f} s (load {t_load:.1f}, sequences {t_seq:.1f}, greedy "
          f"{t_greedy:.1f}) -> {out} ({os.path.getsize(out) / 1e6:.2f} MB)", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=DEFAULT_MODELS, choices=list(MODELS))
    p.add_argument("--out", default=os.path.join(ROOT, "tests", "golden"))
    p.add_argument("--lumen-home", default=lumen_pull.lumen_home())
    p.add_argument("--threads", type=int, default=SETTINGS["n_threads"],
                   help="llama.cpp threads (results do not depend on it; on a busy machine "
                        "fewer threads than cores avoids spinning at barriers)")
    p.add_argument("--f32", metavar="LUMEN", default=None,
                   help="make the F32 reference (<model>-f32.json) instead: convert the model "
                        "with this `lumen` binary and run llama.cpp with an F32 KV cache")
    args = p.parse_args()
    SETTINGS["n_threads"] = SETTINGS["n_threads_batch"] = args.threads
    for name in args.models:
        run_model(name, args.lumen_home, args.out, args.f32)


if __name__ == "__main__":
    main()
