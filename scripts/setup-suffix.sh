#!/usr/bin/env bash
# Suffix decoding for the serve env (vLLM's `--speculative-config '{"method": "suffix"}'`, compared by
# `invoke evaluate --compare none,ngram,suffix,...`): vLLM imports its suffix tree from the optional package
# arctic-inference, which PyPI ships for this platform only as an sdist (0.3.0). This builds that sdist's wheel once,
# with its build tools in a scratch folder (nanobind, cmake, ninja, grpcio-tools: never installed into the serve env,
# whose protobuf vLLM pins), and installs the wheel with --no-deps: the suffix tree is a nanobind extension that
# needs numpy alone. The package's vLLM plugin entry point does nothing unless ARCTIC_INFERENCE_ENABLED is set
# (specops never sets it), so the env's servers are as before. Idempotent: a stamp holds this script's hash.
# Needs a C++20 compiler (g++ 10 or newer). Prints the time it took.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VLLM_VENV:-.venv-vllm}
VERSION=0.3.0
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
