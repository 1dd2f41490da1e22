#!/usr/bin/env bash
# Builds llama.cpp's own HTTP server, llama-server, from the llama.cpp that the llama-cpp-python
# sdist vendors (the same llama.cpp as the `llamacpp` bench method), once per version and flags;
# called by scripts/setup.sh. The binary lands in
#   ${SPECDEC_CACHE:-~/.cache/specdec}/llama-server/<version>-<hash of the flags>/llama-server
# and a second set-up (or a new .venv) finds it there and builds nothing.
#
# Why llama.cpp's own server: only it runs draft-model speculation (--model-draft) and reports
# how many drafted tokens were accepted (`timings.draft_n`, `draft_n_accepted`), which is what
# `specdec bench --endpoint` and the endpoint tests measure. llama-cpp-python's server
# (python -m llama_cpp.server) offers prompt lookup only and no timings.
#
# Why these flags: only the llama-server target is built, linked statically (one file that
# needs no library path); no web UI (LLAMA_BUILD_UI=OFF builds none with npm and
# LLAMA_USE_PREBUILT_UI=OFF downloads none: the API is all specdec needs); no OpenSSL (the
# server listens on loopback in plain HTTP); GGML_NATIVE=OFF compiles the x86-64-v3 kernels
# (AVX2, FMA, F16C) that scripts/setup_llamacpp.sh compiles for llama-cpp-python, so the
# server and the `llamacpp` bench method run the same code. Build time: docs/serving.md.
# Extra CMake flags: SPECDEC_LLAMA_SERVER_CMAKE_ARGS (appended; a later -D wins; a new cache key).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.3.36
PY=${PYTHON_FOR_SETUP:-.venv/bin/python}
FLAGS="-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_OPENSSL=OFF \
 -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
 -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF ${SPECDEC_LLAMA_SERVER_CMAKE_ARGS:-}"
key="$VERSION-$(printf '%s' "$FLAGS" | sha256sum | cut -c1-12)"
dest="${SPECDEC_CACHE:-$HOME/.cache/specdec}/llama-server/$key"
if [ -x "$dest/llama-server" ]; then
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
echo "[setup] building llama-server (llama.cpp of llama-cpp-python $VERSION) into $dest: once, about 3 minutes on 2 cores (6 CPU-minutes)"
"$PY" -m pip download --quiet --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d "$work"
tar -xzf "$work/llama_cpp_python-$VERSION.tar.gz" -C "$work"
src="$work/llama_cpp_python-$VERSION/vendor/llama.cpp"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
# shellcheck disable=SC2086  # FLAGS is a list of -D options
cmake -S "$src" -B "$work/build" "${generator[@]}" $FLAGS >"$work/configure.log" \
  || { cat "$work/configure.log" >&2; exit 1; }
cmake --build "$work/build" --target llama-server -j "${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
# Moved into place in one rename, so an interrupted build never leaves a binary that looks done.
mkdir -p "$(dirname "$dest")"
staging=$(mktemp -d "$(dirname "$dest")/.build-XXXXXX")
cp "$work/build/bin/llama-server" "$staging/llama-server"
printf '%s\n' "llama-cpp-python $VERSION (vendored llama.cpp)" "$FLAGS" >"$staging/BUILD_INFO"
rm -rf "$dest"
mv "$staging" "$dest"
echo "[setup] llama-server ready: $dest/llama-server"
