# shellcheck shell=bash
# Sourced by the GPU-machine scripts (bench/cuda_*_run.sh). lumen_cuda_env points pkg-config and
# the loader at .deps/root (the Debian packages the GPU machine lacks, unpacked by
# `bash bench/cuda_device_run.sh --prepare-deps`), writes .pc files for zstd and
# libcrypto where the machine has their headers but no .pc, and finds nvcc.
# Needs ROOT and BUILD set; sets NVCC, DEPS, LIBDIR; exports PATH, PKG_CONFIG_PATH,
# LD_LIBRARY_PATH. Returns 2 (after saying why) when .deps is missing.
lumen_cuda_env() {
  NVCC="$(command -v nvcc || true)"
  [ -n "$NVCC" ] || NVCC=/usr/local/cuda/bin/nvcc
  DEPS="$ROOT/.deps/root"
  LIBDIR="$DEPS/usr/lib/x86_64-linux-gnu"
  if [ ! -d "$DEPS/usr" ]; then
    echo "missing $DEPS: carry .deps (bash bench/cuda_device_run.sh --prepare-deps makes it)"
    return 2
  fi
  local pc="$BUILD/pkgconfig" f
  mkdir -p "$pc"
  for f in "$LIBDIR"/pkgconfig/*.pc; do
    sed -e "s|=/usr|=$DEPS/usr|g" "$f" > "$pc/$(basename "$f")"
  done
  chmod +x "$DEPS"/usr/bin/* 2> /dev/null || true
  export LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  command -v pkg-config > /dev/null 2>&1 || export PATH="$DEPS/usr/bin:$PATH"
  local sys_pc="/usr/lib/x86_64-linux-gnu/pkgconfig:/usr/share/pkgconfig:/usr/lib/pkgconfig"
  export PKG_CONFIG_PATH="$pc:$sys_pc${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  local spec name header lib
  for spec in "libzstd:zstd.h:zstd" "libcrypto:openssl/sha.h:crypto"; do
    IFS=: read -r name header lib <<< "$spec"
    if ! pkg-config --exists "$name" 2> /dev/null && [ -f "/usr/include/$header" ]; then
      printf 'prefix=/usr\nlibdir=/usr/lib/x86_64-linux-gnu\nincludedir=/usr/include\nName: %s\nDescription: %s\nVersion: 1\nLibs: -L${libdir} -l%s\nCflags: -I${includedir}\n' \
        "$name" "$name" "$lib" > "$pc/$name.pc"
    fi
  done
  return 0
}

# Configures $BUILD with the CUDA backend and builds the given targets (log in
# $OUT/build.log); returns 2, showing the errors, when that fails. Needs
# lumen_cuda_env first. LUMEN_CUDA_FLAGS: extra nvcc flags (e.g. -lineinfo).
lumen_cuda_build() {
  local t0
  t0=$(date +%s)
  cmake -S "$ROOT" -B "$BUILD" -DLUMEN_CUDA=ON -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_FLAGS="${LUMEN_CUDA_FLAGS:-}" > "$OUT/build.log" 2>&1 &&
    cmake --build "$BUILD" -j"$(nproc)" --target "$@" >> "$OUT/build.log" 2>&1 ||
    { grep -E -A4 "error" "$OUT/build.log" | head -40; return 2; }
  echo "built in $(( $(date +%s) - t0 ))s"
}

# The opening of every one-call GPU script: OUT ($OUT or $ROOT/cuda-run-out) and BUILD
# ($LUMEN_CUDA_BUILD or $ROOT/build-cuda-device) made, the environment set, the given
# targets built. Needs ROOT; returns 2 (after saying why) when that fails.
lumen_cuda_setup() {
  OUT="${OUT:-$ROOT/cuda-run-out}"
  BUILD="${LUMEN_CUDA_BUILD:-$ROOT/build-cuda-device}"
  mkdir -p "$OUT" "$BUILD"
  lumen_cuda_env && lumen_cuda_build "$@"
}

# The Qwen2.5-1.5B-shaped benchmark models with random weights (bench_make_model):
# sets GGUF (Q4_K_M-like) and HF (bf16 folder) in /dev/shm/lumen-bench, made once per
# machine.
lumen_bench_models() {
  local m=/dev/shm/lumen-bench
  GGUF="$m/qwen2.5-1.5b-shaped-q4_k_m.gguf" HF="$m/qwen2.5-1.5b-shaped-bf16"
  mkdir -p "$m"
  [ -f "$m/.done" ] || { "$BUILD/bench_make_model" --gguf "$GGUF" --hf "$HF" --threads "$(nproc)" > "$OUT/models.log" 2>&1 &&
    touch "$m/.done"; }
}
