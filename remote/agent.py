"""The agent call: run `python -m specops ...` in the host's env and read its one JSON document.

Normally one round trip: the host checks that its agent matches this checkout's bundle hash and
runs it. When this side has no record that the host is current, the bundle travels on stdin of
the same command and is installed before the agent runs. If the host turns out stale anyway (exit
AgentExit.STALE_BUNDLE: someone changed the workdir), the call is repeated once with the bundle.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remote import bundle as bundle_module
from remote import journal
from remote.errors import AgentError
from remote.inventory import Host
from remote.ssh import Connection
from specops.contract import commandline
from specops.contract.protocol import AgentExit

# Positional parameters keep every value quoted: $1 workdir, $2 bundle hash, $3 python, $4 install
# script (or empty), then the agent's own arguments. A leading ~/ means the remote user's home.
_PRELUDE = rf"""
W=$1; PY=$3
case $W in '~'/*) W=$HOME/${{W#'~/'}};; esac
case $PY in '~'/*) PY=$HOME/${{PY#'~/'}};; esac
{{ [ -d "$W" ] || mkdir -p "$W"; }} && cd "$W" || exit {AgentExit.NO_WORKDIR:d}
if [ -n "$4" ]; then
  "$PY" -c "$4" "$PWD" "$2" || {{
    echo "specops: installing the agent bundle failed" >&2; exit {AgentExit.INSTALL_FAILED:d}; }}
else
  H=; read -r H 2>/dev/null <state/agent.sha256  # a builtin: no process for the bundle check
  [ "$H" = "$2" ] || exit {AgentExit.STALE_BUNDLE:d}
fi
command -v "$PY" >/dev/null 2>&1 || {{
  echo "specops: python not found: $PY" >&2; exit {AgentExit.PYTHON_NOT_FOUND:d}; }}
shift 4
SPECOPS_WORKDIR=$PWD PYTHONPATH=$PWD/src${{PYTHONPATH:+:$PYTHONPATH}} exec "$PY" -m specops "$@" </dev/null
"""


@dataclass
class AgentResult:
    exit_code: int
    document: dict[str, Any]
    stderr: str = ""
    round_trips: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def _marker(host: Host) -> Path:
    """This side's note that the host has the current bundle (a hint only: the host checks too)."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in f"{host.name}-{host.workdir}")
    return journal.journal_path().parent / "agent-current" / safe


def _known_current(host: Host, digest: str) -> bool:
    marker = _marker(host)
    return marker.exists() and marker.read_text().strip() == digest


def _remember_current(host: Host, digest: str) -> None:
    marker = _marker(host)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(digest)


def forget_current(host: Host) -> None:
    _marker(host).unlink(missing_ok=True)


def agent_argv(host: Host, args: Sequence[str], *, env_role: str | None, digest: str, install: bool) -> list[str]:
    """`sh -c PRELUDE` with the prelude's four positional parameters, then the agent's arguments."""
    from remote.revision import revision_note

    script = bundle_module.install_script(revision_note(digest)) if install else ""
    prelude_args = [host.workdir, digest, host.env_python(env_role), script]
    return ["sh", "-c", _PRELUDE, "specops-agent", *prelude_args, *args]


def _run(host: Host, env_role: str | None,
         runner: Callable[[bool, bytes | None], tuple[int, bytes, bytes]]) -> tuple[int, bytes, bytes, int]:
    """Run the agent through `runner(install, archive)`; install first when this side has no record that
    the host is current, and once more with the bundle when the host says it is stale."""
    bundle = bundle_module.build_bundle()
    install = not _known_current(host, bundle.digest)
    trips = 1
    code, out, err = runner(install, bundle.archive if install else None)
    if code == AgentExit.STALE_BUNDLE and not install:
        trips += 1
        code, out, err = runner(True, bundle.archive)
    if code == AgentExit.INSTALL_FAILED:
        raise AgentError(f"{host.name}: could not install the agent in {host.workdir}: "
                         f"{err.decode(errors='replace').strip()[-500:]}")
    if code == AgentExit.PYTHON_NOT_FOUND:
        raise AgentError(f"{host.name}: the host's python {host.env_python(env_role)!r} was not found "
                         f"(inventory hosts.{host.name}.python)")
    if code == AgentExit.NO_WORKDIR:
        raise AgentError(f"{host.name}: cannot create or enter workdir {host.workdir!r} "
                         f"(inventory hosts.{host.name}.workdir)")
    _remember_current(host, bundle.digest)
    return code, out, err, trips


def _parse(host: Host, code: int, out: bytes, err: bytes) -> dict[str, Any]:
    lines = [line for line in out.decode(errors="replace").splitlines() if line.strip()]
    if not lines:
        raise AgentError(f"{host.name}: the agent printed nothing (exit {code}): "
                         f"{err.decode(errors='replace').strip()[-800:]}")
    try:
        document = json.loads(lines[-1])
    except json.JSONDecodeError:
        raise AgentError(f"{host.name}: the agent's output is not JSON (exit {code}): {lines[-1][:300]}") from None
    if not isinstance(document, dict):
        raise AgentError(f"{host.name}: the agent returned {type(document).__name__}, not an object")
    return document


def agent_call(conn: Connection, host: Host, args: Sequence[str], *, env_role: str | None = None,
               timeout: float | None = None) -> AgentResult:
    """Run one agent command on the host and return its JSON document."""

    digest = bundle_module.build_bundle().digest

    def runner(install: bool, archive: bytes | None) -> tuple[int, bytes, bytes]:
        argv = agent_argv(host, args, env_role=env_role, digest=digest, install=install)
        result = conn.run(argv, stdin=archive, timeout=timeout)
        return result.exit_code, result.stdout, result.stderr

    code, out, err, trips = _run(host, env_role, runner)
    return AgentResult(code, _parse(host, code, out, err), err.decode(errors="replace"), trips)


def agent_stream(conn: Connection, host: Host, args: Sequence[str], on_document: Callable[[dict[str, Any]], None],
                 *, env_role: str | None = None, timeout: float | None = None,
                 on_stderr: Callable[[bytes], None] | None = None) -> int:
    """Run a JSON-lines agent command, calling `on_document` for each line as it arrives."""

    digest = bundle_module.build_bundle().digest

    def runner(install: bool, archive: bytes | None) -> tuple[int, bytes, bytes]:
        pending = bytearray()
        errors = bytearray()

        def on_stdout(chunk: bytes) -> None:
            pending.extend(chunk)
            while (newline := pending.find(b"\n")) >= 0:
                line = bytes(pending[:newline])
                del pending[:newline + 1]
                if line.strip():
                    on_document(json.loads(line))

        def collect_err(chunk: bytes) -> None:
            errors.extend(chunk)
            if on_stderr:
                on_stderr(chunk)

        if install:
            # Installing needs stdin, which a stream does not carry: install with a ping first.
            ping = agent_argv(host, commandline.ping(), env_role=env_role, digest=digest, install=True)
            result = conn.run(ping, stdin=archive, timeout=timeout)
            if result.exit_code != 0:
                return result.exit_code, result.stdout, result.stderr
        argv = agent_argv(host, args, env_role=env_role, digest=digest, install=False)
        code = conn.stream(argv, on_stdout=on_stdout, on_stderr=collect_err, timeout=timeout)
        return code, b"", bytes(errors)

    code, _out, _err, _trips = _run(host, env_role, runner)
    return code
