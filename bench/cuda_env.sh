# shellcheck shell=bash
# Sourced by the GPU-machine scripts (bench/cuda_bench_run.sh): points pkg-config and
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
