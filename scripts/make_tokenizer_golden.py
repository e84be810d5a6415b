#!/usr/bin/env python3
"""Golden token ids for the real-model tokenizer test (tests/unit/test_tokenizer_models.c).

For each model (smollm2-135m, gemma3-270m, qwen2.5-coder-1.5b) this tokenizes a fixed corpus of
strings with llama.cpp (llama-cpp-python, vocabulary only) and writes
tests/golden/tokenizer/NAME.json: per string its bytes (hex), its text, and the ids with
parse_special off, with it on, and with it on plus the model's BOS/EOS (add_special).

With --hf it also writes a Hugging Face style tokenizer folder for each model under
~/.cache/lumen/tokenizers/NAME/ (tokenizer.json, tokenizer_config.json, generation_config.json)
converted from the GGUF's tokenizer metadata, loads it with the `tokenizers` library, and records
that library's ids for every string ("hf": encode(text, add_special_tokens=False)). The C test
loads those folders with lm_tokenizer_from_hf_folder and compares against "hf". The script reports
every string where `tokenizers` and llama.cpp disagree (expected only where the tokenizer.json
normalizes, e.g. NFC for Qwen2).

Usage: /work/dl/venv/bin/python scripts/make_tokenizer_golden.py [--hf] [--hf-only] [--models a,b]
  --hf-only: only write the HF folders (the C test's fixtures) and check them against the committed
  golden; needs `tokenizers` and the GGUFs, not llama.cpp.
Needs: llama-cpp-python; with --hf also `tokenizers`.
"""
import argparse
import glob
import json
import os
import random
import struct
import sys
import unicodedata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "golden", "tokenizer")
MODELS_DIR = os.path.expanduser("~/.cache/lumen/models")
HF_DIR = os.path.expanduser("~/.cache/lumen/tokenizers")
MODELS = ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-1.5b"]


# ---------------------------------------------------------------------------------------------
# The corpus. Deterministic: hand-written strings by category, then seeded random mixes of them.

def corpus():
    c = []

    def add(cat, *items):
        for s in items:
            c.append((cat, s))

    add("prose",
        "Hello world", "Hello, world!", " Hello", "hello", "HELLO", "The quick brown fox jumps over the lazy dog.",
        "It was the best of times, it was the worst of times.", "Mr. Smith's car isn't here; he'll be back at 5pm.",
        "  two leading spaces", "trailing spaces   ", "A", "a", " ", "",
        "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore.")
    add("contractions",
        "don't", "I'M HERE", "they'RE", "We've", "you'll", "she'd", "it's", "DON'T", "o'clock",
        "rock 'n' roll", "’s curly", "l'homme", "'s", "''", "'''hello'''")
    add("code",
        "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
        "int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
        "for (let i = 0; i < 10; i++) { console.log(`i=${i}`); }",
        "fn main() -> Result<(), Box<dyn Error>> {\n    let v: Vec<u8> = vec![1, 2, 3];\n    Ok(())\n}",
        "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do echo \"$f\"; done\n",
        "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
        "{\"key\": [1, 2.5, true, null], \"nested\": {\"a\": \"b\"}}",
        "<html><body><div class=\"x\">Hi</div></body></html>",
        "x+=1;y-=2;z*=3;w/=4;",
        "if x == 1:\n\tpass\nelif x != 2:\n\t\tpass\n",
        "    indented four\n        indented eight\n            twelve",
        "a->b->c; p = &q; *ptr++ = 0;",
        "import numpy as np\nnp.zeros((3, 4), dtype=np.float32)",
        "// comment\n/* block\n   comment */\n",
        "class Foo:\n    def __init__(self):\n        self.x = {'a': 1}\n",
        "std::vector<std::string> v{\"a\", \"b\"};",
        "lambda x: x**2 if x%2==0 else -x",
        "print('Hello,\\tworld!\\n')",
        "git commit -m \"fix: handle CRLF\" && git push origin main",
        "$ ls -la /usr/local/bin | grep -E '^d' | wc -l",
        "@decorator\ndef f(*args, **kwargs): ...",
        "<?php echo $_GET['q']; ?>",
        "0b1010 | 0o777 & 0xDEADBEEF ^ ~0",
        "```python\nprint(1)\n```",
        "\tif (a && b || !c) { return; }\r\n")
    add("whitespace",
        "  ", "   ", "    ", "        ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\n\n\n\n\n\n\n\n",
        "\r\n", "\r\n\r\n", "\r", " \n", "\n ", " \n ", "a\n\nb", "a  b", "a   b", "a \t b",
        "\u00a0non-breaking\u00a0space", "ideographic\u3000space", "en\u2002em\u2003thin\u2009",
        "line1\nline2\r\nline3\rline4", " " * 40, "\n" * 40, "\t \t \n \t", "x" + " " * 17 + "y",
        "word \n\n  word", "\u2028line sep\u2029para sep", "\x0bvertical\x0cform feed")
    add("digits",
        "1", "12", "123", "1234", "12345", "1234567890", "3.14159", "1,000,000", "0x1F", "2026-11-30",
        "12:34:56", "+1 (555) 010-9999", "1e-10", "-42", "v1.2.3", "99 bottles", "abc123def", "123abc",
        "\u0661\u0662\u0663", "\u2460\u2461\u2462", "\u00bd \u00bc \u00be", "\u216b", "\u0967\u0968\u0969",
        "\uff11\uff12\uff13", "9" * 50, "10000000000000000000000000000")
    add("emoji",
        "\U0001F642", "\U0001F469\u200D\U0001F4BB", "\U0001F1EB\U0001F1F7", "\U0001F44D\U0001F3FD", "\u2764\uFE0F",
        "1\uFE0F\u20E3", "I love \U0001F355 and \U0001F363!", "\U0001F600\U0001F601\U0001F602\U0001F923",
        "\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466", "\u2600\u2601\u2602", "\U0001F3F3\uFE0F\u200D\U0001F308",
        "emoji\U0001F525in\U0001F525words", "\U0001F9D1\U0001F3FB\u200D\U0001F52C", "\u263A", "\U0001FAE0")
    add("cjk",
        "\u4f60\u597d\uff0c\u4e16\u754c\uff01", "\u6211\u7231\u5317\u4eac\u5929\u5b89\u95e8",
        "\u3053\u3093\u306b\u3061\u306f\u4e16\u754c", "\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a",
        "\uc548\ub155\ud558\uc138\uc694 \uc138\uacc4", "\u6771\u4eac\u90fd\u6e0b\u8c37\u533a",
        "Python\u662f\u4e00\u79cd\u7f16\u7a0b\u8bed\u8a00", "\u4e2d\u6587 English \u6df7\u5408 123",
        "\uff21\uff22\uff23\uff41\uff42\uff43", "\u3002\u3001\u300c\u300d\u300e\u300f",
        "\u8fd9\u662f\u4e00\u4e2a\u5f88\u957f\u7684\u53e5\u5b50\uff0c\u5305\u542b\u6807\u70b9\u7b26\u53f7\u3002",
        "\u65e5\u672c\u8a9e\u306e\u6587\u7ae0\u3067\u3059\u3002", "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
        "\u9f8d\u9f98\u9f49", "\U00020000\U0002A6D6", "\u3400\u4dbf",
        "def \u51fd\u6570(): return '\u503c'", "\u00e4\u00f6\u00fc \u4e2d \u0416")
    add("rtl",
        "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645", "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
        "\u0627\u0644\u0639\u0631\u0628\u064a\u0629 123 English", "\u200f\u05e2\u05d1\u05e8\u05d9\u05ea\u200e",
        "\u0628\u0650\u0633\u0652\u0645\u0650 \u0671\u0644\u0644\u0651\u064e\u0647\u0650", "\u202eRLO override\u202c",
        "\u0641\u0627\u0631\u0633\u06cc \u06f1\u06f2\u06f3", "\u05d0\u05b8\u05d1\u05b8\u05d0", "\u0627\u0644\u0633\u0644\u0627\u0645 \u0639\u0644\u064a\u0643\u0645!",
        "mixed \u05e2\u05d1\u05e8\u05d9\u05ea and \u0639\u0631\u0628\u064a", "\u0627\u0644\u0640\u0640\u0640\u0640\u0639\u0631\u0628\u064a\u0629",
        "\u0698\u067e\u0686\u06af", "\u202b\u05e2\u05d1\u202c")
    add("scripts",
        "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!", "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5",
        "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e", "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e0a\u0e32\u0e27\u0e42\u0e25\u0e01",
        "Ti\u1ebfng Vi\u1ec7t c\u00f3 d\u1ea5u", "e\u0301 cafe\u0301 nai\u0308ve", "\u00e9 caf\u00e9 na\u00efve",
        "\u1100\u1161\u11a8", "stra\u00dfe STRASSE", "\u0130stanbul \u0131", "\u10e5\u10d0\u10e0\u10d7\u10e3\u10da\u10d8",
        "\u0531\u0562\u0563", "\u12a0\u121b\u122d\u129b", "\u0d2e\u0d32\u0d2f\u0d3e\u0d33\u0d02", "\u1f00\u1f10\u1f20 \u03d0",
        "\ufb01 \ufb02 \u2126 \u212b", "A\u030a \u00c5")
    add("odd",
        "\ufffd", "\ufffd\ufffd abc \ufffd", "\x80\x85\x9f", "\ufdd0\uffff\ufffe", "\ufeffBOM at start",
        "zero\u200bwidth\u200cjoin\u200dx", "\u00c3\u00a9 mojibake \u00e2\u20ac\u2122", "\u0301 lone combining",
        "\ue000\uf8ff private use", "\U0010FFFF max", "\\ud800 escaped surrogate", "\x00 nul \x00",
        "\x01\x02\x03\x1b[0m", "\x7f del", "\\x80\\xff literal escapes", "\u034f\u180e\u2060",
        "a\u0300\u0301\u0302\u0303\u0304\u0305", "\U0001D400\U0001D401 math bold", "\u2062\u2063\u2064")
    add("special",
        "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>",
        "<s>", "</s>", "<pad>", "<unk>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
        "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
        "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
        "<|im_start", "im_start|>", "<|im_start|><|im_end|>", "<<|im_start|>>", "text<|endoftext|>more",
        "<bos><start_of_turn>user", " <|im_end|> ", "<|im_end|>\n\n<|im_start|>", "<0x41>", "<0x0A>",
        "[multimodal]", "<table><tr><td>1</td></tr></table>", "<unused0>", "<mask>",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>", "<repo_name>lumen<file_sep>main.c")
    add("punct",
        "!!!", "...", "?!", "--", "=>", "::", "<<<>>>", "https://example.com/path?q=1&r=2#frag",
        "user@example.com", "# Heading\n\n- item 1\n- item 2\n\n**bold** _it_", "(((nested)))", "\"quoted\" 'single'",
        "\u201csmart quotes\u201d \u2018single\u2019", "\u2014em dash\u2013en dash\u2026", "$100.00 \u20ac50 \u00a330 \u00a5",
        "50% off!!! (limited)", "a.b.c.d", "___init___", "~~~~~~", "|||", "C:\\Users\\me\\file.txt", "@@ -1,3 +1,4 @@",
        "\u00bfQu\u00e9? \u00a1S\u00ed!")
    add("long",
        "hello " * 200, " " * 500, "1234567890" * 30, "\u4f60\u597d" * 100, "ab" * 300,
        "The tokenizer must be exact. " * 40, "\U0001F642" * 50, "-" * 300)

    # seeded random mixes of the fragments above (short ones)
    rng = random.Random(20261130)
    pool = [s for _, s in c if 0 < len(s) <= 40]
    for i in range(40):
        k = rng.randint(2, 5)
        sep = rng.choice(["", " ", "\n", "  ", "\t", ""])
        c.append(("mix", sep.join(rng.choice(pool) for _ in range(k))))

    cases = [{"cat": cat, "bytes": s.encode("utf-8")} for cat, s in c]
    # invalid UTF-8: tokenized byte-wise by lumen; llama.cpp replaces bad bytes with U+FFFD first
    for b in [b"\xff", b"\xc3\x28", b"abc\x80def", b"\xe2\x82", b"\xf0\x9f\x98", b"\xed\xa0\x80 surrogate",
              b"\xc0\xaf overlong", b"ok \xfe\xff\xfe end", b"mixed \xe4\xbd\xa0\xe5 tail"]:
        cases.append({"cat": "invalid", "bytes": b, "invalid_utf8": True})
    return cases


# ---------------------------------------------------------------------------------------------
# A small GGUF metadata reader (only the key/value section).

def read_gguf_kv(path):
    with open(path, "rb") as f:
        data = f.read(64 << 20)
    if data[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    off = 4
    (version,) = struct.unpack_from("<I", data, off)
    off += 4
    n_tensors, n_kv = struct.unpack_from("<QQ", data, off)
    off += 16
    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def rd_str(o):
        (n,) = struct.unpack_from("<Q", data, o)
        return data[o + 8:o + 8 + n], o + 8 + n

    def rd_val(t, o):
        if t == 8:
            return rd_str(o)
        if t == 9:
            et, n = struct.unpack_from("<IQ", data, o)
            o += 12
            if et == 8:
                out = []
                for _ in range(n):
                    s, o = rd_str(o)
                    out.append(s)
                return out, o
            fmt = scalar[et]
            sz = struct.calcsize(fmt)
            return list(struct.unpack_from("<%d%s" % (n, fmt), data, o)), o + n * sz
        fmt = scalar[t]
        return struct.unpack_from("<" + fmt, data, o)[0], o + struct.calcsize(fmt)

    kv = {}
    for _ in range(n_kv):
        k, off = rd_str(off)
        (t,) = struct.unpack_from("<I", data, off)
        off += 4
        v, off = rd_val(t, off)
        kv[k.decode()] = v
    return kv


def gguf_path(name):
    files = sorted(glob.glob(os.path.join(MODELS_DIR, name, "*.gguf")))
    return files[0] if files else None


# ---------------------------------------------------------------------------------------------
# tokenizer.json from GGUF metadata

QWEN2_RE = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def looks_special(t):
    return t.startswith("<|") and t.endswith("|>")


def hf_folder_from_gguf(name, kv):
    toks = [t.decode("utf-8", "surrogateescape") for t in kv["tokenizer.ggml.tokens"]]
    types = kv.get("tokenizer.ggml.token_type", [1] * len(toks))
    model = kv["tokenizer.ggml.model"].decode()
    pre = kv.get("tokenizer.ggml.pre", b"default").decode()
    tmpl = kv.get("tokenizer.chat_template", b"").decode()

    def tid(key):
        v = kv.get("tokenizer.ggml." + key)
        return v if isinstance(v, int) else None

    added = []
    for i, (t, ty) in enumerate(zip(toks, types)):
        if ty in (3, 4):  # control -> special added token, user-defined -> normal added token
            added.append({"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": ty == 3})
    keep = [i for i, ty in enumerate(types) if ty != 5]  # unused padding tokens are gaps in HF
    vocab = {toks[i]: i for i in keep}

    if model == "gpt2":
        merges = [m.decode("utf-8").split(" ", 1) for m in kv["tokenizer.ggml.merges"]]
        bpe = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
               "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
               "vocab": vocab, "merges": merges}
        if pre == "smollm":
            normalizer = None
            pre_tok = {"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": True},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}
        elif pre == "qwen2":
            normalizer = {"type": "NFC"}
            pre_tok = {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN2_RE}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
        else:
            raise ValueError(f"{name}: no tokenizer.json recipe for pre-tokenizer {pre}")
        decoder = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
        post = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
    elif model == "llama":
        # SentencePiece-style BPE: merges from the scores (every split of a token into two tokens,
        # ranked by the merged token's score, best first), byte fallback, spaces as U+2581
        scores = kv["tokenizer.ggml.scores"]
        order = sorted(range(len(toks)), key=lambda i: (-scores[i], i))
        merges = []
        for i in order:
            t = toks[i]
            if types[i] in (2, 5, 6):
                continue
            for k in range(1, len(t)):
                a, b = t[:k], t[k:]
                if a in vocab and b in vocab:
                    merges.append([a, b])
        bpe = {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
               "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
               "vocab": vocab, "merges": merges}
        add_prefix = kv.get("tokenizer.ggml.add_space_prefix", True)
        steps = [{"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]
        if add_prefix:
            steps.insert(0, {"type": "Prepend", "prepend": "\u2581"})
        normalizer = steps[0] if len(steps) == 1 else {"type": "Sequence", "normalizers": steps}
        # as transformers' GemmaTokenizer writes it (a no-op: no space survives the normalizer)
        pre_tok = {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False}
        decoder = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]}
        post = None
        bos = tid("bos_token_id")
        if kv.get("tokenizer.ggml.add_bos_token", True) and bos is not None:
            post = {"type": "TemplateProcessing",
                    "single": [{"SpecialToken": {"id": toks[bos], "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                    "pair": [{"SpecialToken": {"id": toks[bos], "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                             {"SpecialToken": {"id": toks[bos], "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                    "special_tokens": {toks[bos]: {"id": toks[bos], "ids": [bos], "tokens": [toks[bos]]}}}
    else:
        raise ValueError(f"{name}: tokenizer model {model} has no recipe")

    tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": normalizer,
          "pre_tokenizer": pre_tok, "post_processor": post, "decoder": decoder, "model": bpe}

    def tok_or_none(key):
        i = tid(key)
        return toks[i] if i is not None and 0 <= i < len(toks) else None

    cfg = {"add_bos_token": bool(kv.get("tokenizer.ggml.add_bos_token", model == "llama")),
           "add_eos_token": bool(kv.get("tokenizer.ggml.add_eos_token", False)),
           "bos_token": tok_or_none("bos_token_id"), "eos_token": tok_or_none("eos_token_id"),
           "unk_token": tok_or_none("unknown_token_id"), "pad_token": tok_or_none("padding_token_id"),
           "clean_up_tokenization_spaces": False, "model_max_length": 32768,
           "tokenizer_class": "PreTrainedTokenizerFast",
           "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added}}
    if name.startswith("qwen"):
        cfg["bos_token"] = None  # as Qwen2's own tokenizer_config.json
        cfg.pop("add_bos_token")
    if tmpl:
        # gemma keeps its template in chat_template.jinja (newer transformers), the others inline
        if name.startswith("gemma"):
            pass
        else:
            cfg["chat_template"] = tmpl
    gen = {"bos_token_id": tid("bos_token_id"), "eos_token_id": tid("eos_token_id")}
    if name.startswith("qwen"):
        gen["eos_token_id"] = [151645, 151643]
    elif name.startswith("gemma"):
        gen["eos_token_id"] = [1, 106]
    return tj, cfg, gen, (tmpl if name.startswith("gemma") else None)


def write_hf_folder(name, kv):
    from tokenizers import Tokenizer

    tj, cfg, gen, jinja = hf_folder_from_gguf(name, kv)
    tok = Tokenizer.from_str(json.dumps(tj, ensure_ascii=False))
    out = os.path.join(HF_DIR, name)
    os.makedirs(out, exist_ok=True)
    # saved by the library itself, so the file is in the format `tokenizers` writes
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump(gen, f, indent=2)
    if jinja:
        with open(os.path.join(out, "chat_template.jinja"), "w", encoding="utf-8") as f:
            f.write(jinja)
    return Tokenizer.from_file(os.path.join(out, "tokenizer.json"))


# ---------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hf", action="store_true", help="also write HF folders and record `tokenizers` ids")
    ap.add_argument("--hf-only", action="store_true",
                    help="only (re)write the HF folders (needs `tokenizers`, not llama.cpp) and check that `tokenizers` "
                         "gives the committed \"hf\" ids")
    ap.add_argument("--models", default=",".join(MODELS))
    args = ap.parse_args()

    if args.hf_only:
        bad = 0
        for name in args.models.split(","):
            path = gguf_path(name)
            if not path:
                print(f"{name}: not pulled, skipped")
                continue
            hf = write_hf_folder(name, read_gguf_kv(path))
            doc = json.load(open(os.path.join(GOLDEN, name + ".json"), encoding="utf-8"))
            n = 0
            for e in doc["cases"]:
                if "hf" in e:
                    n += 1
                    if hf.encode(bytes.fromhex(e["hex"]).decode("utf-8"), add_special_tokens=False).ids != e["hf"]:
                        bad += 1
            print(f"{name}: wrote {os.path.join(HF_DIR, name)}; `tokenizers` matches the golden on {n - bad}/{n}")
        sys.exit(1 if bad else 0)

    import llama_cpp
    from llama_cpp import Llama

    cases = corpus()
    os.makedirs(GOLDEN, exist_ok=True)
    for name in args.models.split(","):
        path = gguf_path(name)
        if not path:
            print(f"{name}: not pulled (no GGUF under {MODELS_DIR}/{name}), skipped")
            continue
        llm = Llama(model_path=path, vocab_only=True, verbose=False)
        hf = None
        if args.hf:
            hf = write_hf_folder(name, read_gguf_kv(path))
        out_cases = []
        n_diff = 0
        for c in cases:
            b = c["bytes"]
            e = {"cat": c["cat"], "hex": b.hex(), "text": b.decode("utf-8", "replace"),
                 "ids": llm.tokenize(b, add_bos=False, special=False),
                 "ids_special": llm.tokenize(b, add_bos=False, special=True),
                 "ids_add_special": llm.tokenize(b, add_bos=True, special=True)}
            if c.get("invalid_utf8"):
                e["invalid_utf8"] = True
            if hf is not None and not c.get("invalid_utf8"):
                e["hf"] = hf.encode(b.decode("utf-8"), add_special_tokens=False).ids
                if e["hf"] != e["ids_special"]:
                    n_diff += 1
                    nfc = unicodedata.normalize("NFC", b.decode()) != b.decode()
                    print(f"{name}: tokenizers != llama.cpp ({'not NFC' if nfc else 'NFC'}) for {b!r}: "
                          f"{e['hf'][:12]} vs {e['ids_special'][:12]}")
            out_cases.append(e)
        doc = {"model": name, "gguf": os.path.basename(path), "reference": "llama.cpp via llama-cpp-python "
               + llama_cpp.__version__, "hf_reference": ("tokenizers " + __import__("tokenizers").__version__) if hf else None,
               "cases": out_cases}
        dst = os.path.join(GOLDEN, name + ".json")
        with open(dst, "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, indent=0)
            f.write("\n")
        print(f"{name}: {len(out_cases)} strings -> {os.path.relpath(dst, ROOT)}"
              + (f"; tokenizers differs from llama.cpp on {n_diff}" if hf else ""))


if __name__ == "__main__":
    main()
