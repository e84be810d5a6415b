#!/bin/sh
# Fetches llama.cpp's vocabulary test vectors (models/ggml-vocab-*.gguf with their
# .inp/.out files, MIT licence) from the pinned llama-cpp-python source archive on
# PyPI, for tests/unit/test_tokenizer_vocab.c. They are ~40 MB, too big to commit.
#
#   scripts/fetch_tokenizer_vocab.sh [DEST]     (default: ~/.cache/lumen/vocab)
#
# The test looks in $LUMEN_VOCAB_DIR, then /work/shared/vocab, then ~/.cache/lumen/vocab.
set -eu

VERSION=0.3.36
DEST=${1:-${LUMEN_VOCAB_DIR:-$HOME/.cache/lumen/vocab}}
PYTHON=${PYTHON:-python3}

if ls "$DEST"/ggml-vocab-llama-spm.gguf.out >/dev/null 2>&1; then
    echo "vocab files already in $DEST"
    exit 0
fi

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

echo "downloading llama-cpp-python==$VERSION (source archive) ..."
"$PYTHON" -m pip download --quiet --no-binary :all: --no-deps --dest "$TMP" "llama-cpp-python==$VERSION"

ARCHIVE=$(ls "$TMP"/llama_cpp_python-*.tar.gz "$TMP"/llama-cpp-python-*.tar.gz 2>/dev/null | head -n 1)
if [ -z "$ARCHIVE" ]; then
    echo "error: no source archive downloaded" >&2
    exit 1
fi

mkdir -p "$DEST"
# vendor/llama.cpp/models/ggml-vocab-* and the licence, nothing else
"$PYTHON" - "$ARCHIVE" "$DEST" <<'EOF'
import os, sys, tarfile
archive, dest = sys.argv[1], sys.argv[2]
n = 0
with tarfile.open(archive) as tf:
    for m in tf.getmembers():
        if not m.isfile():
            continue
        parts = m.name.split("/")
        name = parts[-1]
        if "vendor" in parts and "models" in parts and name.startswith("ggml-vocab-"):
            out = os.path.join(dest, name)
        elif parts[-3:] == ["vendor", "llama.cpp", "LICENSE"]:
            out = os.path.join(dest, "LICENSE-llama.cpp")
        else:
            continue
        with tf.extractfile(m) as src, open(out, "wb") as dst:
            dst.write(src.read())
        n += 1
print(f"extracted {n} files into {dest}")
EOF
