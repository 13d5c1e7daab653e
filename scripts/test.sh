#!/usr/bin/env bash
# The test command: sets up everything it needs (Debian packages, .venv, Python deps), then runs
# the linter and the whole test suite (real sshd, real tmux, real wheels, tiny models).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
exec .venv/bin/python -m pytest "$@"
