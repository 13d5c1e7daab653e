#!/usr/bin/env bash
# One-shot set-up of a fresh Debian machine (as root) or an existing checkout: system packages,
# a virtualenv at .venv, control-side, host-side and test deps. Idempotent and quick when done.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
for pair in sshd:openssh-server tmux:tmux rsync:rsync nft:nftables ip:iproute2; do
  bin=${pair%%:*}; pkg=${pair##*:}
  command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${need_apt[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.specops-deps
want=$(cat requirements/*.txt scripts/setup.sh | sha256sum | cut -d' ' -f1)
# pip repeats one warning per package for index folders this machine's pip config names but lacks.
quiet() { "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; }
# Say what is being installed, one line per package pip resolves, instead of minutes of silence.
progress() { "$@" 2>&1 | { grep -E "^(Collecting|Successfully installed|ERROR|error)" | sed -e 's/^/  pip: /' || true; }; }
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  start=$(date +%s)
  echo "setup: [1/4] upgrading pip in .venv" >&2
  quiet .venv/bin/pip install -q --upgrade pip
  echo "setup: [2/4] control side (invoke, fabric, rich ...), host side (CPU torch 2.13.0 from this" \
       "machine's disk, transformers, datasets ...) and test deps (pytest, ruff, import-linter ...)" >&2
  progress .venv/bin/pip install --progress-bar off -r requirements/control.txt -r requirements/host.txt \
    -r requirements/test.txt >&2
  echo "setup: [3/4] speculators 0.9.0 and hs-connectors 0.9.0 without their declared deps" >&2
  progress .venv/bin/pip install --progress-bar off --no-deps -r requirements/pinned-ml.txt >&2
  # Never let a torchvision/torchaudio sneak in: they break `import transformers` beside CPU torch.
  echo "setup: [4/4] removing torchvision/torchaudio/torchcodec if anything pulled them in" >&2
  .venv/bin/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  echo "$want" >"$stamp"
  echo "setup: .venv ready in $(( $(date +%s) - start )) s" >&2
fi
# This checkout's src/ on the venv's path, so `lint-imports` (and `import specops`) work without a
# PYTHONPATH prefix; an explicit PYTHONPATH (the agent's bundle on a host) still comes first.
site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$PWD/src" >"$site/specops-checkout-src.pth"
