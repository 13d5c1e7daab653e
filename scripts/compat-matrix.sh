#!/usr/bin/env bash
# Regenerate COMPAT.md: the doctor's stack verdict for every released speculators minor × every vLLM minor's
# latest patch release (0.11 … 0.33), from the released wheels (fetched once into ~/.cache/specops/wheels;
# vLLM wheels are ~300 MB each, ~8 GB in all). Usage: scripts/compat-matrix.sh [output file, default COMPAT.md]
set -euo pipefail
cd "$(dirname "$0")/.."
SPECULATORS="0.3.0,0.4.0.1,0.5.0,0.6.0.2,0.7.0.2,0.8.1,0.9.0"
VLLM="0.11.0,0.11.2,0.12.0,0.13.0,0.14.1,0.15.1,0.16.0,0.17.1,0.18.1,0.19.1,0.20.2,0.21.0,0.22.1,0.23.0,0.24.0"
VLLM="$VLLM,0.25.1,0.26.0,0.27.1,0.28.0,0.29.0,0.30.0,0.31.0,0.32.0,0.33.0"
out="${1:-COMPAT.md}"
# the table is written outside the tree while it is made (minutes), then moved in whole: no half-written file
tmp="$(mktemp "${TMPDIR:-/tmp}/compat.XXXXXX")"
trap 'rm -f "$tmp" "$out.partial"' EXIT
.venv/bin/invoke compat --speculators "$SPECULATORS" --vllm "$VLLM" --markdown > "$tmp"
cp "$tmp" "$out.partial"
chmod 644 "$out.partial"
mv "$out.partial" "$out"
echo "wrote $out" >&2
