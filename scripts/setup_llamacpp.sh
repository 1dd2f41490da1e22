#!/usr/bin/env bash
# Builds llama-cpp-python (CPU) from its PyPI source into .venv; called by scripts/setup.sh.
#
# Why from source: PyPI has no CPU wheel of llama-cpp-python for Linux, only the sdist (the
# project's CPU wheels live on its own index, which CI may not reach). Why these flags: the
# Python bindings need only libllama and libggml*; llama.cpp's tools, examples, tests and
# server binaries are off already when it is built as a subproject, and LLAVA_BUILD=OFF skips
# the multimodal library (libmtmd), which specdec never loads. GGML_NATIVE=OFF compiles for the
# x86-64-v3 set (SSE4.2, AVX, AVX2, FMA, F16C, BMI2) instead of -march=native: pip caches the
# built wheel keyed by the sdist, not by the CPU or the flags, so a native wheel built on an
# AVX-512 runner and restored from a shared pip cache onto an AVX2 one would die with SIGILL.
# On this project's AVX2 machines native and x86-64-v3 are the same code. Elsewhere (AVX-512):
#   .venv/bin/pip uninstall -y llama-cpp-python
#   SPECDEC_LLAMACPP_CMAKE_ARGS="-DGGML_NATIVE=ON" bash scripts/setup_llamacpp.sh
# Build time and figures: docs/llamacpp.md.
#
# Safe to re-run: an installed pinned version is kept, and pip reuses its cached wheel when
# .venv is recreated (no second build).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
VERSION=0.3.36

installed=$("$PY" -c "import importlib.metadata as m; print(m.version('llama_cpp_python'))" 2>/dev/null || true)
[ "$installed" = "$VERSION" ] && exit 0
if ! command -v "${CXX:-c++}" >/dev/null; then
  echo "[setup] llama-cpp-python is built from source and needs a C/C++ compiler (e.g. apt-get install build-essential)" >&2
  exit 1
fi
# llama-cpp-python forces LLAMA_BUILD_COMMON=ON in its cache, yet never loads llama.cpp's common
# library (chat parsers, HTTP client: half of all compile time); a normal variable set right
# after llama.cpp's project() call shadows that cache entry (CMP0077/CMP0126), so it is skipped.
hook_dir=$(mktemp -d)
trap 'rm -rf "$hook_dir"' EXIT
echo 'set(LLAMA_BUILD_COMMON OFF)' > "$hook_dir/no-common.cmake"
# The install dirs keep llama.cpp's own install rules (libraries, headers, cmake and pkg-config
# files) inside the llama_cpp package instead of site-packages/lib and site-packages/include.
args="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DCMAKE_PROJECT_llama.cpp_INCLUDE=$hook_dir/no-common.cmake \
 -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF \
 -DCMAKE_INSTALL_LIBDIR=llama_cpp/lib -DCMAKE_INSTALL_INCLUDEDIR=llama_cpp/include -DCMAKE_INSTALL_BINDIR=llama_cpp/lib"
cache=()
if [ -n "${SPECDEC_LLAMACPP_CMAKE_ARGS:-}" ]; then
  # Appended, so a later -D wins. A wheel from other flags is neither cached nor taken from the
  # cache: pip's cache key knows nothing of CMAKE_ARGS.
  args="$args $SPECDEC_LLAMACPP_CMAKE_ARGS"
  cache=(--no-cache-dir)
fi
echo "[setup] installing llama-cpp-python==$VERSION: built from source the first time (5 CPU-minutes, about 4 minutes on 2 idle cores), then pip's cached wheel"
CMAKE_ARGS="$args" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
  "$PY" -m pip install "${cache[@]}" --no-binary llama-cpp-python "llama-cpp-python[server]==$VERSION"
