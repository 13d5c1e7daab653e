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
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing Python deps into .venv" >&2
  quiet .venv/bin/pip install -q --upgrade pip
  quiet .venv/bin/pip install -q -r requirements/control.txt -r requirements/host.txt -r requirements/test.txt
  quiet .venv/bin/pip install -q --no-deps -r requirements/pinned-ml.txt
  # Never let a torchvision/torchaudio sneak in: they break `import transformers` beside CPU torch.
  .venv/bin/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  echo "$want" >"$stamp"
fi
