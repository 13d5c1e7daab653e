#!/usr/bin/env bash
# Suffix decoding for the serve env (vLLM's `--speculative-config '{"method": "suffix"}'`, compared by
# `invoke evaluate --compare none,ngram,suffix,...`): vLLM imports its suffix tree from the optional package
# arctic-inference, which PyPI ships for this platform only as an sdist (0.3.0). This builds that sdist's wheel once,
# with its build tools in a scratch folder (nanobind, cmake, ninja, grpcio-tools: never installed into the serve env,
# whose protobuf vLLM pins), and installs the wheel with --no-deps: the suffix tree is a nanobind extension that
# needs numpy alone. The package's vLLM plugin entry point does nothing unless ARCTIC_INFERENCE_ENABLED is set
# (specops never sets it), so the env's servers are as before. Idempotent: a stamp holds this script's hash.
# Needs a C++20 compiler (g++ 10 or newer). Prints the time it took.
#
# For a GPU host's serve env (README, "A GPU host's serve env"), whose Python may differ from this machine's:
#   bash scripts/setup-suffix.sh --wheel PYTHON OUT
# builds the same wheel for PYTHON (that interpreter on this machine, e.g. a pyenv 3.12 for a host on Python 3.12)
# into OUT without installing it anywhere; pack it with the serve env (scripts/gpu-serve-env.sh BUNDLE -- OUT/*.whl)
# or install it there with `pip install --no-deps`. The suffix tree runs on the CPU, so one wheel serves any GPU.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=0.3.0
if [ "${1:-}" = --wheel ]; then
  python=${2:?usage: scripts/setup-suffix.sh --wheel PYTHON OUT}; out=${3:?usage: scripts/setup-suffix.sh --wheel PYTHON OUT}
  start=$(date +%s)
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  quiet() { "$@" >"$scratch/pip.log" 2>&1 || { cat "$scratch/pip.log" >&2; exit 1; }; }
  echo "setup-suffix: building arctic-inference $VERSION's suffix tree for $("$python" -V)" >&2
  # setup.py imports torch: a scratch venv of that python holds one (any build; nothing of it goes in the wheel)
  quiet "$python" -m venv "$scratch/venv"
  quiet "$scratch/venv/bin/pip" install -q torch setuptools wheel numpy
  quiet "$scratch/venv/bin/pip" install -q --target "$scratch/tools" "nanobind==2.9.2" cmake ninja grpcio-tools \
    "protobuf==5.29.6"
  # cmake finds the python on PATH: the scratch venv's, so the extension is built for PYTHON, not this machine's
  PATH="$scratch/venv/bin:$scratch/tools/bin:$PATH" PYTHONPATH="$scratch/tools" \
    CMAKE_ARGS="-DPython_EXECUTABLE=$scratch/venv/bin/python -DPython3_EXECUTABLE=$scratch/venv/bin/python" \
    quiet "$scratch/venv/bin/pip" wheel -q --no-cache-dir --no-deps --no-build-isolation --no-binary arctic-inference \
    -w "$scratch/wheel" "arctic-inference==$VERSION"
  quiet "$scratch/venv/bin/pip" install -q --no-deps --target "$scratch/check" "$scratch"/wheel/arctic_inference-*.whl
  PYTHONPATH="$scratch/check" "$scratch/venv/bin/python" -c \
    "from arctic_inference.suffix_decoding import SuffixDecodingCache" || exit 1
  mkdir -p "$out" && cp "$scratch"/wheel/arctic_inference-*.whl "$out/"
  echo "setup-suffix: $(ls "$out"/arctic_inference-*.whl) in $(( $(date +%s) - start )) s" >&2
  exit 0
fi

VENV=${VLLM_VENV:-.venv-vllm}
[ -x "$VENV/bin/python" ] || { echo "setup-suffix: $VENV/bin/python: missing; run scripts/setup-vllm.sh first" >&2; exit 2; }
stamp=$VENV/.specops-suffix
want=$(sha256sum scripts/setup-suffix.sh | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] \
    && "$VENV/bin/python" -c "import arctic_inference.suffix_decoding" 2>/dev/null; then
  exit 0
fi
start=$(date +%s)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# each pip step's output goes to a log shown only when it fails (the --target install of the build tools prints
# resolver warnings about the serve env that do not apply: nothing of it changes)
quiet() { "$@" >"$scratch/pip.log" 2>&1 || { cat "$scratch/pip.log" >&2; exit 1; }; }
echo "setup-suffix: building arctic-inference $VERSION's suffix tree for $VENV" >&2
# the build's own tools on PYTHONPATH only for the build (setup.py imports torch, which the serve env has)
quiet "$VENV/bin/pip" install -q --target "$scratch/tools" "nanobind==2.9.2" cmake ninja grpcio-tools "protobuf==5.29.6"
PATH="$scratch/tools/bin:$PATH" PYTHONPATH="$scratch/tools" \
  quiet "$VENV/bin/pip" wheel -q --no-deps --no-build-isolation --no-binary arctic-inference -w "$scratch/wheel" \
  "arctic-inference==$VERSION"
quiet "$VENV/bin/pip" install -q --no-deps --force-reinstall "$scratch"/wheel/arctic_inference-*.whl
"$VENV/bin/python" -c "from arctic_inference.suffix_decoding import SuffixDecodingCache; print('setup-suffix: arctic-inference', __import__('importlib.metadata').metadata.version('arctic-inference'))" >&2
echo "$want" >"$stamp"
echo "setup-suffix: done in $(( $(date +%s) - start )) s" >&2
