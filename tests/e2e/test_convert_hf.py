#!/usr/bin/env python3
"""`lumen convert MODEL OUT_DIR` checked against Hugging Face transformers.

usage: test_convert_hf.py LUMEN LUMEN_LOGITS GOLDEN_TOKENIZER_DIR

For each model (smollm2-135m, gemma3-270m, qwen2.5-coder-0.5b; LUMEN_HF_MODELS=a,b to
choose; a model that is not pulled is skipped with a line saying so):
  1. `lumen convert MODEL DIR --json` writes the bf16 folder; the summary is checked;
  2. transformers loads it (AutoTokenizer, AutoModelForCausalLM with float32 compute);
     the last-token logits of a few prompts (8 to ~600 tokens: past Gemma's 512-token
     window) are compared with Lumen's on the same folder (LUMEN_LOGITS, a small
     program over Lumen's forward pass): max |diff| and top-1 agreement;
  3. AutoTokenizer's ids on the 298-string golden corpus (tests/golden/tokenizer/, the
     strings that are valid UTF-8) are compared with `lumen tokenize MODEL --json` on the
     GGUF. transformers' Qwen2Tokenizer always applies NFC (hard-coded in its class,
     whatever tokenizer.json says) while the GGUF tokenizer does not normalize, so for
     Qwen the few strings that NFC changes are compared against `lumen tokenize` of
     their NFC form instead (and counted apart).

Needs torch + transformers: when they cannot be imported the test exits 77 (skipped),
or re-runs itself under $LUMEN_HF_PYTHON when that names another interpreter
(e.g. a venv that has them). Pinned and measured with torch 2.15.0 (CPU),
transformers 5.24.0, tokenizers 0.23.3; results in docs/GOLDEN.md.
"""
import json
import os
import subprocess
import sys
import tempfile
import time
import unicodedata

SKIP = 77
MODELS = {
    "smollm2-135m": "LlamaForCausalLM",
    "gemma3-270m": "Gemma3ForCausalLM",
    "qwen2.5-coder-0.5b": "Qwen2ForCausalLM",
}
GOLDEN_CORPUS = {"qwen2.5-coder-0.5b": "qwen2.5-coder-1.5b"}  # same vocabulary, same corpus
# Max |logit difference| allowed between transformers and Lumen on the same bf16 weights,
# both computing in float32 (what differs is summation order and elementwise functions).
LOGIT_TOL = 0.05
STORY = ("Once upon a time, in a small village by the sea, there lived an old fisherman who told stories "
         "about the stars, the tides and the twelve ships that never came home. ")
PROMPTS = [
    "The capital of France is",
    "def quicksort(arr):\n    \"\"\"Sort a list.\"\"\"\n    if len(arr) <= 1:\n        return arr\n",
    "<|im_start|>user\nWhat is 12 * 7? Answer briefly.<|im_end|>\n<|im_start|>assistant\n",
    STORY * 20,  # ~600 tokens
]


def need_transformers():
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
        return
    except ImportError as e:
        alt = os.environ.get("LUMEN_HF_PYTHON")
        if alt and not os.environ.get("LUMEN_HF_REEXEC"):
            os.environ["LUMEN_HF_REEXEC"] = "1"
            os.execv(alt, [alt] + sys.argv)
        print(f"SKIP: torch/transformers cannot be imported ({e}); set LUMEN_HF_PYTHON to an interpreter that has them")
        sys.exit(SKIP)


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def lumen_tokenize(lumen, model, text, tmp):
    path = os.path.join(tmp, "text.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    r = run([lumen, "tokenize", model, "--file", path, "--json"])
    if r.returncode != 0:
        raise RuntimeError(f"lumen tokenize failed: {r.stderr}")
    return json.loads(r.stdout)["ids"]


def check_model(name, lumen, logits_bin, golden_dir, tmp, report):
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = os.path.join(tmp, name)
    t0 = time.time()
    r = run([lumen, "convert", name, out, "--json", "--no-progress"])
    if r.returncode != 0 and "lumen pull" in r.stderr:
        print(f"{name}: SKIP (not pulled: {r.stderr.strip()})")
        return None
    if r.returncode != 0:
        print(f"{name}: FAIL: lumen convert: {r.stderr.strip()}")
        return False
    summary = json.loads(r.stdout)
    ok = True
    for key, want in (("architecture", MODELS[name]), ("format", "hf"), ("dtype", "bfloat16"), ("tokenizer", True)):
        if summary.get(key) != want:
            print(f"{name}: FAIL: summary {key} = {summary.get(key)!r}, expected {want!r}")
            ok = False
    print(f"{name}: converted in {time.time() - t0:.1f} s: {summary['tensors']} tensors, "
          f"{summary['weight_bytes'] / 2**20:.0f} MiB, {summary['shards']} shard(s)")

    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    model.eval()
    res = {"model": name, "tokenizer_class": type(tok).__name__, "prompts": []}

    # --- logits: transformers vs Lumen on the same folder ---
    prompt_ids = [tok(p)["input_ids"] for p in PROMPTS]
    for p, ids in zip(PROMPTS, prompt_ids):
        want = lumen_tokenize(lumen, name, p, tmp)
        if ids != want:
            print(f"{name}: FAIL: prompt {p[:30]!r}: AutoTokenizer {ids[:12]} != lumen tokenize {want[:12]}")
            ok = False
    ids_file, logits_file = os.path.join(tmp, "ids.txt"), os.path.join(tmp, "logits.bin")
    with open(ids_file, "w") as f:
        for ids in prompt_ids:
            f.write(" ".join(map(str, ids)) + "\n")
    r = run([logits_bin, out, ids_file, logits_file])
    if r.returncode != 0:
        print(f"{name}: FAIL: lumen_logits: {r.stderr.strip()}")
        return False
    n_vocab = json.loads(r.stdout)["n_vocab"]
    ours = np.fromfile(logits_file, dtype="<f4").reshape(len(PROMPTS), n_vocab)
    worst, top1 = 0.0, 0
    for i, ids in enumerate(prompt_ids):
        with torch.no_grad():
            theirs = model(torch.tensor([ids])).logits[0, -1].float().numpy()
        d = float(np.max(np.abs(theirs[:n_vocab] - ours[i])))
        a, b = int(np.argmax(theirs)), int(np.argmax(ours[i]))
        srt = np.sort(theirs)
        gap = float(srt[-1] - srt[-2])
        print(f"  prompt {i} ({len(ids)} tokens): max |diff| {d:.3g} (logits span {float(srt[0]):.1f}..{float(srt[-1]):.1f}), "
              f"top-1 transformers {a} / lumen {b} (top-2 gap {gap:.3f})")
        res["prompts"].append({"tokens": len(ids), "max_abs_diff": d, "top1_same": a == b})
        worst = max(worst, d)
        top1 += a == b
        if d > LOGIT_TOL or (a != b and gap > 0.05):
            ok = False
    res["max_abs_diff"], res["top1"] = worst, f"{top1}/{len(prompt_ids)}"
    print(f"{name}: logits transformers vs lumen: max |diff| {worst:.3g} (tolerance {LOGIT_TOL}), "
          f"top-1 agreement {top1}/{len(prompt_ids)}")
    if worst > LOGIT_TOL:
        print(f"{name}: FAIL: logits differ by more than {LOGIT_TOL}")

    # --- tokenizer: AutoTokenizer on the folder vs lumen tokenize on the GGUF ---
    with open(os.path.join(golden_dir, GOLDEN_CORPUS.get(name, name) + ".json"), encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    n = same = nfc_cases = 0
    nfc_model = type(tok).__name__ == "Qwen2Tokenizer"
    for c in cases:
        try:
            text = bytes.fromhex(c["hex"]).decode("utf-8")
        except UnicodeDecodeError:
            continue  # invalid UTF-8 cannot be given to AutoTokenizer
        ref_text = text
        if nfc_model and unicodedata.normalize("NFC", text) != text:
            ref_text = unicodedata.normalize("NFC", text)
            nfc_cases += 1
        got = tok(text)["input_ids"]
        want = lumen_tokenize(lumen, name, ref_text, tmp)
        n += 1
        if got == want:
            same += 1
        else:
            print(f"  tokens differ on {text[:40]!r}: AutoTokenizer {got[:10]} lumen {want[:10]}")
    note = f" ({nfc_cases} NFC-changed strings compared in NFC form)" if nfc_cases else ""
    print(f"{name}: AutoTokenizer ({type(tok).__name__}) vs lumen tokenize: {same}/{n} corpus strings identical{note}")
    res["tokenizer"] = f"{same}/{n}"
    res["nfc_cases"] = nfc_cases
    if same != n:
        ok = False
    report.append(res)
    del model
    return ok


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    lumen, logits_bin, golden_dir = sys.argv[1:4]
    need_transformers()
    import tokenizers
    import torch
    import transformers

    torch.set_num_threads(2)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, tokenizers {tokenizers.__version__}")
    names = [m for m in os.environ.get("LUMEN_HF_MODELS", ",".join(MODELS)).split(",") if m]
    report, failed, ran = [], [], 0
    with tempfile.TemporaryDirectory(prefix="lumen_convert_hf_") as tmp:
        for name in names:
            if name not in MODELS:
                print(f"{name}: unknown here (known: {', '.join(MODELS)})")
                failed.append(name)
                continue
            r = check_model(name, lumen, logits_bin, golden_dir, tmp, report)
            if r is None:
                continue
            ran += 1
            if not r:
                failed.append(name)
            subprocess.run(["rm", "-rf", os.path.join(tmp, name)])
    print("summary: " + json.dumps(report))
    if failed:
        print("FAILED: " + ", ".join(failed))
        return 1
    if ran == 0:
        print("SKIP: none of the models is pulled")
        return SKIP
    return 0


if __name__ == "__main__":
    sys.exit(main())
