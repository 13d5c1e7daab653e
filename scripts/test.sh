#!/usr/bin/env bash
# The test command: sets up everything it needs (Debian packages, .venv, Python deps, the vLLM
# `serve` env .venv-vllm), then runs the linter and the whole test suite (real sshd, real tmux,
# real wheels, tiny models, a real vLLM CPU server). Extra arguments go to pytest, e.g.
# `scripts/test.sh -m "not vllm"`; SPECOPS_SKIP_VLLM_SETUP=1 skips building .venv-vllm (its
# tests then skip themselves, saying why).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "${SPECOPS_SKIP_VLLM_SETUP:-0}" != 1 ]; then
  bash scripts/setup-vllm.sh
fi
.venv/bin/ruff check .
# The rules of the house as import contracts (pyproject.toml [tool.importlinter]).
.venv/bin/lint-imports --no-cache
# Two workers (pytest-xdist) on a 2-core machine; every test of the serve env in one of them
# (xdist_group "vllm": one patch application, one shared vLLM server). SPECOPS_TEST_WORKERS=0: none.
exec .venv/bin/python -m pytest -n "${SPECOPS_TEST_WORKERS:-2}" --dist loadgroup --durations=25 "$@"
