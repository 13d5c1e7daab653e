#!/usr/bin/env bash
# The main job on the embedded default: the `local` host and a tiny generated model, on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/invoke pipeline --host local "$@"
