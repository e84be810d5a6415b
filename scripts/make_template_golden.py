#!/usr/bin/env python3
"""Renders every chat template under tests/golden/templates/ with Python's jinja2, configured the way
Hugging Face transformers configures it for apply_chat_template, on the conversations of
tests/golden/templates/conversations.json, and writes the expected outputs (or the error jinja2 raised)
to tests/golden/templates/expected/<template>.json.

The C test tests/unit/test_template_golden.c compares lumen's renderer against these files byte for byte.

Usage: scripts/make_template_golden.py [--import DIR]   (--import copies DIR/*.jinja in first)
Needs: jinja2 (pip install jinja2).
"""
import argparse
import datetime
import glob
import json
import os
import shutil
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "golden", "templates")

# strftime_now is pinned so that the outputs are reproducible; the C test pins the same instant.
FIXED_NOW = datetime.datetime(2025, 3, 7, 14, 5, 9)
BOS, EOS = "<s>", "</s>"


def make_env():
    """The environment of transformers' chat template renderer (utils/chat_template_utils.py), written anew:
    an immutable sandbox, trim_blocks + lstrip_blocks, the loopcontrols extension, a {% generation %} block
    that only marks assistant text, tojson without HTML escaping (ensure_ascii=False by default, indent and
    separators passed through), raise_exception and strftime_now."""

    class GenerationBlock(jinja2.ext.Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_passthrough"), [], [], body).set_lineno(lineno)

        def _passthrough(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return FIXED_NOW.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(env, source, conv):
    """The rendered text, or the error as {"error": type: message}."""
    try:
        tmpl = env.from_string(source)
        out = tmpl.render(messages=conv["messages"], tools=conv.get("tools"), documents=None,
                          add_generation_prompt=conv["add_generation_prompt"], bos_token=BOS, eos_token=EOS,
                          **conv.get("extra", {}))
        return {"output": out}
    except Exception as e:  # any failure is a golden outcome: lumen must fail too
        return {"error": f"{type(e).__name__}: {e}"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--import", dest="imp", help="copy DIR/*.jinja into the golden folder first")
    args = ap.parse_args()
    if args.imp:
        for p in sorted(glob.glob(os.path.join(args.imp, "*.jinja"))):
            shutil.copy(p, os.path.join(GOLDEN, os.path.basename(p)))
    with open(os.path.join(GOLDEN, "conversations.json"), encoding="utf-8") as f:
        convs = json.load(f)
    env = make_env()
    os.makedirs(os.path.join(GOLDEN, "expected"), exist_ok=True)
    n_ok = n_err = 0
    for path in sorted(glob.glob(os.path.join(GOLDEN, "*.jinja"))):
        name = os.path.basename(path)[:-len(".jinja")]
        with open(path, encoding="utf-8", newline="") as f:
            source = f.read()
        results = {}
        for cname, conv in convs.items():
            r = render(env, source, conv)
            results[cname] = r
            if "error" in r:
                n_err += 1
            else:
                n_ok += 1
        with open(os.path.join(GOLDEN, "expected", name + ".json"), "w", encoding="utf-8", newline="\n") as f:
            json.dump(results, f, indent=1, ensure_ascii=False, sort_keys=True)
            f.write("\n")
    print(f"{n_ok} rendered, {n_err} errors recorded", file=sys.stderr)


if __name__ == "__main__":
    main()
