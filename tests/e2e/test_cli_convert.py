#!/usr/bin/env python3
"""`lumen convert` from the command line (no Python packages needed).

usage: test_cli_convert.py LUMEN

On smollm2-135m (skipped with exit 77 when it is not pulled): --help; a folder with
--json (the summary, the files, the config); --shard-size (shards + index); an
existing non-empty OUT_DIR refused without --force (and left as it was), replaced
with it; bad --dtype / --shard-size / unknown model / missing arguments (exit 2 or 1
with a sentence); the progress bar on a terminal (a pseudo-terminal) and none
otherwise; the OUT.gguf mode (f16 rewrite) still works; nothing temporary is left.
"""
import json
import os
import pty
import subprocess
import sys
import tempfile

SKIP = 77
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, **kw)


def run_pty(args):
    """Runs with stderr on a pseudo-terminal; returns (exit code, what the terminal got)."""
    pid, fd = pty.fork()
    if pid == 0:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.execv(args[0], args)
    out = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out.decode("utf-8", "replace")


def main():
    lumen = sys.argv[1]
    model = "smollm2-135m"
    r = run([lumen, "convert", "--help"])
    check(r.returncode == 0 and "OUT_DIR" in r.stdout and "--force" in r.stdout and "--json" in r.stdout
          and "default: bf16" in r.stdout, "--help lists the options with their defaults")
    r = run([lumen, "inspect", model])
    if r.returncode != 0:
        print(f"SKIP: {model} is not pulled (run `lumen pull {model}`)")
        return SKIP

    with tempfile.TemporaryDirectory(prefix="lumen_cli_convert_") as tmp:
        out = os.path.join(tmp, "a", "smol")  # the parent does not exist yet
        r = run([lumen, "convert", model, out, "--json"])
        check(r.returncode == 0, f"convert to a folder (exit {r.returncode}: {r.stderr.strip()[:200]})")
        s = json.loads(r.stdout) if r.returncode == 0 else {}
        check(s.get("architecture") == "LlamaForCausalLM" and s.get("dtype") == "bfloat16" and s.get("shards") == 1
              and s.get("tensors") == 272 and s.get("vocab") == 49152 and s.get("merges") == 48900
              and s.get("chat_template") is True and s.get("tied_embeddings") is True, f"--json summary {s}")
        names = sorted(os.listdir(out)) if os.path.isdir(out) else []
        check(names == ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                        "tokenizer_config.json"], f"the folder holds {names}")
        with open(os.path.join(out, "config.json")) as f:
            cfg = json.load(f)
        check(cfg.get("model_type") == "llama" and cfg.get("rope_theta") == 100000 and cfg.get("rms_norm_eps") == 1e-5
              and cfg.get("num_key_value_heads") == 3 and cfg.get("torch_dtype") == "bfloat16", "config.json values")
        with open(os.path.join(out, "tokenizer_config.json")) as f:
            tc = json.load(f)
        check(tc.get("chat_template", "").startswith("{% for message in messages %}") and tc.get("eos_token") == "<|im_end|>",
              "tokenizer_config.json: chat template and eos token")
        r = run([lumen, "inspect", out])
        check(r.returncode == 0 and "Hugging Face folder" in r.stdout, "the folder loads in lumen inspect")

        # an existing non-empty OUT_DIR
        r = run([lumen, "convert", model, out])
        check(r.returncode == 1 and "not empty" in r.stderr and "--force" in r.stderr,
              f"refused without --force: {r.stderr.strip()}")
        check(os.path.exists(os.path.join(out, "model.safetensors")), "the existing folder is untouched")
        open(os.path.join(out, "stale.txt"), "w").close()
        r = run([lumen, "convert", model, out, "--force", "--dtype", "f16"])
        check(r.returncode == 0 and not os.path.exists(os.path.join(out, "stale.txt")), "replaced with --force")
        with open(os.path.join(out, "config.json")) as f:
            check(json.load(f).get("torch_dtype") == "float16", "--dtype f16 in config.json")

        # shards
        sh = os.path.join(tmp, "sharded")
        r = run([lumen, "convert", model, sh, "--shard-size", "100M", "--json"])
        s = json.loads(r.stdout) if r.returncode == 0 else {}
        files = sorted(os.listdir(sh)) if os.path.isdir(sh) else []
        check(s.get("shards") == 3 and "model-00001-of-00003.safetensors" in files
              and "model.safetensors.index.json" in files and "model.safetensors" not in files, f"shards: {files}")
        if "model.safetensors.index.json" in files:
            with open(os.path.join(sh, "model.safetensors.index.json")) as f:
                idx = json.load(f)
            check(len(idx["weight_map"]) == 272 and idx["metadata"]["total_size"] == s.get("weight_bytes"),
                  "index: every tensor, total size")
        r = run([lumen, "inspect", sh])
        check(r.returncode == 0, "the sharded folder loads")

        # bad input
        for args, code, needle in (
            (["--dtype", "q8_0"], 2, "--dtype must be bf16, f16 or f32"),
            (["--shard-size", "lots"], 2, "--shard-size must be a size"),
            (["--bogus"], 2, "unexpected argument --bogus"),
        ):
            r = run([lumen, "convert", model, os.path.join(tmp, "x")] + args)
            check(r.returncode == code and needle in r.stderr, f"{args}: exit {r.returncode}, {r.stderr.strip()[:80]}")
        r = run([lumen, "convert", model])
        check(r.returncode == 2 and "usage" in r.stderr, "missing OUT_DIR: usage, exit 2")
        r = run([lumen, "convert", "no-such-model", os.path.join(tmp, "x")])
        check(r.returncode == 1 and "no-such-model" in r.stderr, f"unknown model: {r.stderr.strip()[:100]}")
        check(not os.path.exists(os.path.join(tmp, "x")), "nothing written on failure")

        # progress bar: on a terminal, not otherwise
        code, term = run_pty([lumen, "convert", model, os.path.join(tmp, "p"), "--json"])
        check(code == 0 and "MiB" in term and "[====" in term, "progress bar on a terminal")
        r = run([lumen, "convert", model, os.path.join(tmp, "q")])
        check(r.returncode == 0 and "[====" not in r.stderr and "wrote" in r.stderr, "no bar when stderr is a pipe")

        # the GGUF rewrite is still there
        g = os.path.join(tmp, "f16.gguf")
        r = run([lumen, "convert", model, g, "--dtype", "f16", "--json"])
        s = json.loads(r.stdout) if r.returncode == 0 else {}
        check(s.get("format") == "gguf" and os.path.getsize(g) > 200 << 20, "OUT.gguf: an f16 GGUF")
        r = run([lumen, "inspect", g])
        check(r.returncode == 0 and "F16" in r.stdout, "the f16 GGUF loads")

        left = [n for root, dirs, fs in os.walk(tmp) for n in dirs + fs if "lumen-tmp" in n or "lumen-old" in n]
        check(not left, f"no temporary folders left {left}")

    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
