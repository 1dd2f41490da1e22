#!/usr/bin/env bash
# Builds llama.cpp's own HTTP server, llama-server, and its benchmark, llama-bench, from the
# llama.cpp that the llama-cpp-python sdist vendors (the same llama.cpp as the `llamacpp` bench
# method), once per version and flags; called by scripts/setup.sh. The binaries land in
#   ${SPECDEC_CACHE:-~/.cache/specdec}/llama-server/<version>-<avx512|portable>-<hash of the flags>/
# and a second set-up (or a new .venv) finds them there and builds nothing.
#   bash scripts/setup_llama_server.sh             # the build for this CPU (what specdec compares with)
#   bash scripts/setup_llama_server.sh --portable  # the x86-64-v3 build (AVX2), for the record
#
# Why llama.cpp's own server: only it runs draft-model speculation (--model-draft) and reports
# how many drafted tokens were accepted (`timings.draft_n`, `draft_n_accepted`), which is what
# `specdec bench --endpoint` and the endpoint tests measure. llama-cpp-python's server
# (python -m llama_cpp.server) offers prompt lookup only and no timings.
#
# Why these flags: only llama-server and llama-bench are built, linked statically (files that
# need no library path); no web UI (LLAMA_BUILD_UI=OFF builds none with npm and
# LLAMA_USE_PREBUILT_UI=OFF downloads none: the API is all specdec needs); no OpenSSL (the
# server listens on loopback in plain HTTP). GGML_NATIVE=OFF compiles the x86-64-v3 kernels
# (AVX2, FMA, F16C); the build for this CPU adds every AVX-512 set /proc/cpuinfo names
# (GGML_AVX512, _VBMI, _VNNI, _BF16, and GGML_AVX_VNNI), as a user would build it for a
# comparison to be fair, and leaves AMX off: GGML_NATIVE=ON turns AMX on and that build
# segfaults at the first token on AMX Xeons (docs/llamacpp.md). The sets a build needs are
# written to its BUILD_INFO (`requires:`), so specdec.external.llama_server never runs a build
# on a CPU that lacks them (a cache restored onto another machine). Build time: docs/llamacpp.md.
# Extra CMake flags: SPECDEC_LLAMA_SERVER_CMAKE_ARGS (appended; a later -D wins; a new cache key).
set -euo pipefail
cd "$(dirname "$0")/.."
portable=0
for arg in "$@"; do
  case "$arg" in
    --portable) portable=1 ;;
    *) echo "usage: bash scripts/setup_llama_server.sh [--portable]" >&2; exit 2 ;;
  esac
done
VERSION=0.3.36
PY=${PYTHON_FOR_SETUP:-.venv/bin/python}
TOOLS=(llama-server llama-bench)
# llama.cpp's option for each instruction set, and the /proc/cpuinfo flags it compiles for
SETS=("GGML_AVX512:avx512f avx512cd avx512vl avx512dq avx512bw" "GGML_AVX512_VBMI:avx512vbmi"
      "GGML_AVX512_VNNI:avx512_vnni" "GGML_AVX512_BF16:avx512_bf16" "GGML_AVX_VNNI:avx_vnni")
cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
options=""
requires=""
if [ "$portable" = 0 ]; then
  for set in "${SETS[@]}"; do
    option=${set%%:*} needed=${set#*:} present=1
    for flag in $needed; do
      [[ "$cpu_flags" == *" $flag "* ]] || present=0
    done
    if [ "$present" = 1 ]; then
      options+=" -D$option=ON"
      requires+=" $needed"
    fi
  done
fi
tag=portable
[ -n "$options" ] && tag=avx512
FLAGS="-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF$options -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF \
 -DGGML_AMX_BF16=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
 -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
 ${SPECDEC_LLAMA_SERVER_CMAKE_ARGS:-}"
key="$VERSION-$tag-$(printf '%s' "$FLAGS" | sha256sum | cut -c1-12)"
dest="${SPECDEC_CACHE:-$HOME/.cache/specdec}/llama-server/$key"
if [ -x "$dest/llama-server" ] && [ -x "$dest/llama-bench" ]; then
  exit 0
fi
if ! command -v "${CXX:-c++}" >/dev/null; then
  echo "[setup] llama-server is built from source and needs a C++ compiler (e.g. apt-get install build-essential)" >&2
  exit 1
fi
if ! command -v cmake >/dev/null; then  # PyPI ships cmake and ninja as wheels
  "$PY" -m pip install --quiet "cmake>=3.18" ninja
  export PATH="$(dirname "$PY"):$PATH"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "[setup] building llama-server and llama-bench ($tag; llama.cpp of llama-cpp-python $VERSION) into $dest: once, about 4 minutes on 2 cores"
"$PY" -m pip download --quiet --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d "$work"
tar -xzf "$work/llama_cpp_python-$VERSION.tar.gz" -C "$work"
src="$work/llama_cpp_python-$VERSION/vendor/llama.cpp"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
# shellcheck disable=SC2086  # FLAGS is a list of -D options
cmake -S "$src" -B "$work/build" "${generator[@]}" $FLAGS >"$work/configure.log" \
  || { cat "$work/configure.log" >&2; exit 1; }
cmake --build "$work/build" --target "${TOOLS[@]}" -j "${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
# Moved into place in one rename, so an interrupted build never leaves binaries that look done.
mkdir -p "$(dirname "$dest")"
staging=$(mktemp -d "$(dirname "$dest")/.build-XXXXXX")
for tool in "${TOOLS[@]}"; do
  cp "$work/build/bin/$tool" "$staging/$tool"
done
printf '%s\n' "llama-cpp-python $VERSION (vendored llama.cpp)" "$FLAGS" "requires:$requires" >"$staging/BUILD_INFO"
rm -rf "$dest"
mv "$staging" "$dest"
echo "[setup] llama-server and llama-bench ready: $dest"
