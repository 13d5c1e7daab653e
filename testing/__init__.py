"""Test helpers as first-class code, shared by tests/ and bench/ (as fabric ships `fabric.testing`).

What a benchmark needs of the test helpers lives here, so that bench/ never imports tests/ (an
import-linter contract in pyproject.toml): a test's refactor never breaks a benchmark, and a benchmark
never runs a test's fixtures. tests/support/ re-exports these modules under their old names and keeps
what only the tests use (pytest fixtures, the shared vLLM server, network namespaces, finished runs).

  repo    where this checkout is
  agent   the host agent as the control side runs it (`python -m specops ...` on a workdir)
  cli     `invoke` on an inventory of the test's own
  sshd    a throwaway OpenSSH server on 127.0.0.1
  wheels  real third-party wheels, fetched once and unpacked into site folders
  runs    run-config variants of runs/tiny.yaml
  vllm    the serve env (.venv-vllm) and a tiny workdir whose runs use it
"""
