#!/usr/bin/env bash
# One call on the GPU machine: build with the CUDA backend, run the op-by-op tests,
# the golden test on CUDA if a model was carried, the matrix-product benchmark, and
# (time permitting) the op tests under compute-sanitizer. Logs go to $OUT.
#
#   run(command="bash bench/cuda_device_run.sh", carry=[".deps"])
#
# Needs: the working tree; .deps/root (Debian packages unpacked with dpkg -x: cJSON,
# PCRE2, utf8proc, libmicrohttpd, pkgconf; about 4 MB), prepared on the build machine
# with `bash bench/cuda_device_run.sh --prepare-deps`.
# Optional: .lumen-home/models/<name>/<file>.gguf (a `lumen pull` store) for the
# golden test; the carry limit (64 MiB with the tree) leaves room only for small
# models, so by default that step is skipped and the tiny-model end-to-end checks of
# test_backend_ops stand in for it.
#
# Exit status: that of test_backend_ops (0 pass, 1 failures), or 2 when the build fails.
set -euo pipefail

T0=$(date +%s)
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# On the build machine (which reaches the Debian mirror): fill .deps and stop.
if [ "${1:-}" = "--prepare-deps" ]; then
  tmp="$(mktemp -d)"
  (cd "$tmp" && apt-get download libcjson1 libcjson-dev libpcre2-dev libpcre2-8-0 libmicrohttpd12 \
     libmicrohttpd-dev libutf8proc2 libutf8proc-dev pkgconf pkgconf-bin libpkgconf3)
  rm -rf "$ROOT/.deps"
  mkdir -p "$ROOT/.deps/root"
  for f in "$tmp"/*.deb; do dpkg -x "$f" "$ROOT/.deps/root"; done
  rm -rf "$tmp"
  cd "$ROOT/.deps/root"
  rm -rf usr/share/doc usr/share/man usr/share/lintian usr/share/info usr/lib/x86_64-linux-gnu/*.a
  # the carry may not keep symlinks: replace each by a copy of its target
  find . -type l | while read -r l; do
    t="$(readlink -f "$l")"
    rm "$l"
    if [ -f "$t" ]; then cp "$t" "$l"; fi
  done
  du -sh "$ROOT/.deps"
  exit 0
fi
OUT="${OUT:-$ROOT/cuda-run-out}"
BUILD="${LUMEN_CUDA_BUILD:-$ROOT/build-cuda-device}"
DEPS="$ROOT/.deps/root"
LIBDIR="$DEPS/usr/lib/x86_64-linux-gnu"
mkdir -p "$OUT" "$BUILD"

step() { echo; echo "=== [$(date +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*"; }
elapsed() { echo $(( $(date +%s) - T0 )); }

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv 2>&1 || true
NVCC="$(command -v nvcc || true)"
[ -n "$NVCC" ] || NVCC=/usr/local/cuda/bin/nvcc
"$NVCC" --version | tail -2
cmake --version | head -1
echo "cores: $(nproc)"

step "dependencies from .deps"
if [ ! -d "$DEPS/usr" ]; then
  echo "missing $DEPS: carry .deps (see the top of this script)"
  exit 2
fi
# pkg-config files with the prefix moved into .deps
PC="$BUILD/pkgconfig"
mkdir -p "$PC"
for f in "$LIBDIR"/pkgconfig/*.pc; do
  sed -e "s|=/usr|=$DEPS/usr|g" "$f" > "$PC/$(basename "$f")"
done
chmod +x "$DEPS"/usr/bin/* 2> /dev/null || true
export LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ! command -v pkg-config > /dev/null 2>&1; then
  echo "no pkg-config here: using the one from .deps"
  export PATH="$DEPS/usr/bin:$PATH"
fi
SYS_PC="/usr/lib/x86_64-linux-gnu/pkgconfig:/usr/share/pkgconfig:/usr/lib/pkgconfig"
export PKG_CONFIG_PATH="$PC:$SYS_PC${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
# zstd and libcrypto are on the machine with headers; write .pc files if theirs are missing
for spec in "libzstd:zstd.h:zstd" "libcrypto:openssl/sha.h:crypto"; do
  IFS=: read -r name header lib <<< "$spec"
  if ! pkg-config --exists "$name" 2> /dev/null; then
    if [ -f "/usr/include/$header" ]; then
      printf 'prefix=/usr\nlibdir=/usr/lib/x86_64-linux-gnu\nincludedir=/usr/include\nName: %s\nDescription: %s\nVersion: 1\nLibs: -L${libdir} -l%s\nCflags: -I${includedir}\n' \
        "$name" "$name" "$lib" > "$PC/$name.pc"
      echo "wrote $PC/$name.pc"
    fi
  fi
done
for m in libcjson libpcre2-8 libutf8proc libzstd libcrypto; do
  printf '  %-12s %s\n' "$m" "$(pkg-config --modversion "$m" 2>&1 || echo MISSING)"
done

step "configure (LUMEN_CUDA=ON, Release)"
if ! cmake -S "$ROOT" -B "$BUILD" -DLUMEN_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$NVCC" \
     > "$OUT/configure.log" 2>&1; then
  tail -40 "$OUT/configure.log"
  exit 2
fi
grep -E "CUDA|Found" "$OUT/configure.log" | head -10 || true

JOBS="${LUMEN_JOBS:-16}"
step "build (-j$JOBS): test_backend_ops golden_models bench_cuda_matvec"
if ! cmake --build "$BUILD" -j"$JOBS" --target test_backend_ops golden_models bench_cuda_matvec > "$OUT/build.log" 2>&1; then
  grep -E -A4 "error|Error" "$OUT/build.log" | head -80
  tail -20 "$OUT/build.log"
  exit 2
fi
grep -c "warning" "$OUT/build.log" | sed 's/^/compiler warnings: /' || true
BIN="$BUILD/tests"

step "test_backend_ops (CUDA vs CPU, every op)"
set +e
(cd "$ROOT" && timeout 300 "$BIN/test_backend_ops") 2>&1 | tee "$OUT/test_backend_ops.log"
TEST_RC=${PIPESTATUS[0]}
set -e
echo "test_backend_ops exit status: $TEST_RC"

step "golden test on CUDA"
if [ -d "$ROOT/.lumen-home/models" ]; then
  export LUMEN_HOME="$ROOT/.lumen-home"
  for d in "$LUMEN_HOME"/models/*/; do
    name="$(basename "$d")"
    [ -f "$ROOT/tests/golden/$name.json" ] || continue
    set +e
    (cd "$ROOT" && LUMEN_TEST_BACKEND=cuda timeout 240 "$BIN/golden_models" "$name") 2>&1 | tee "$OUT/golden_$name.log"
    echo "golden $name exit status: ${PIPESTATUS[0]}"
    set -e
  done
else
  echo "skipped: no .lumen-home/models carried (the tiny-model checks above cover end to end)"
fi

step "matrix-product benchmark (Qwen2.5-1.5B shapes)"
set +e
timeout 200 "$BUILD/bench_cuda_matvec" 2>&1 | tee "$OUT/bench_cuda_matvec.log"
set -e

step "summary"
echo "--- op tests ---"
grep -E "FAIL|comparisons|invariance" "$OUT/test_backend_ops.log" | head -60 || true
echo "--- decode matvec (n=1) bandwidth, GB/s of weights streamed ---"
awk '$4 == 1 && NF >= 6 {printf "  %-6s %-17s %9s us  %6s GB/s\n", $1, $2" "$3, $5, $6}' "$OUT/bench_cuda_matvec.log" || true
grep -E "device copy|decode step" "$OUT/bench_cuda_matvec.log" || true
echo "--- crossover: gate 8960x1536 by n (us/call) ---"
awk '$2 == "gate" {printf "  %-6s n=%-4s %9s us  %6s TFLOP/s\n", $1, $4, $5, $7}' "$OUT/bench_cuda_matvec.log" || true

SANITIZER="$(command -v compute-sanitizer || true)"
[ -n "$SANITIZER" ] || SANITIZER="$(dirname "$NVCC")/compute-sanitizer"
if [ "$(elapsed)" -lt 330 ] && [ -x "$SANITIZER" ]; then
  step "compute-sanitizer memcheck on the quick op tests"
  set +e
  (cd "$ROOT" && LUMEN_TEST_OPS_QUICK=1 timeout $(( 510 - $(elapsed) )) "$SANITIZER" --tool memcheck \
     --error-exitcode 9 "$BIN/test_backend_ops") > "$OUT/memcheck.log" 2>&1
  MC_RC=$?
  set -e
  grep -E "ERROR SUMMARY|Invalid|out of bounds|comparisons" "$OUT/memcheck.log" | head -20 || true
  echo "memcheck exit status: $MC_RC (0 clean, 9 errors found, 124 timed out)"
else
  echo "memcheck skipped (elapsed $(elapsed)s or no compute-sanitizer)"
fi

step "done in $(elapsed)s; logs in $OUT"
exit "$TEST_RC"
