"""Regenerated answers host to host: every host's share joined, in share order, onto every host.

Each host's `step regenerate --part I/COUNT` wrote its share of the conversations (a contiguous run
of source rows, so joining the shares in part order is source order) as JSONL under its own run
folder. Over the verified connections a task already holds (remote.group.Group's sessions), the
control side reads every share (responses and errors), and writes the joined files on every host
into a temporary file beside the final one, renamed in: a cut transfer never leaves half an answers
file under its final name; `step regenerate --require-whole` then checks it covers every conversation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from remote.errors import AgentError

if TYPE_CHECKING:
    from remote.group import Group

# read a file that may be absent (speculators writes no errors file when nothing failed)
READ = '[ ! -e "$1" ] || cat -- "$1"'
WRITE = ('set -e; tmp=$(mktemp "$1.incoming-XXXXXX"); trap \'rm -f "$tmp"\' EXIT; cat > "$tmp"; '
         'mv -f "$tmp" "$1"; trap - EXIT')
KINDS = (("errors", "errors_output"), ("responses", "output"))  # errors first: responses mark it written


def regenerating(parts: dict[str, dict[str, Any]]) -> bool:
    """Whether the run regenerates (every host's part report has a share)."""
    return all("part" in report for report in parts.values())


def _path(host: str, value: object) -> str:
    if not isinstance(value, str) or not value.startswith("/") or "/../" in value:
        raise AgentError(f"{host}: reported answers file {value!r} is not an absolute path")
    return value


def same_regeneration(parts: dict[str, dict[str, Any]]) -> None:
    """Every host must have cut the same conversations with the same inputs: else the shares do not fit."""
    plans = {name: (report["inputs_hash"], report["part"]["source"], report["part"]["count"])
             for name, report in parts.items()}
    if len(set(plans.values())) > 1:
        shown = ", ".join(f"{name}: {digest[:12]} of {conversations} conversations"
                          for name, (digest, conversations, _shares) in plans.items())
        raise AgentError(f"regenerate across hosts: the hosts planned different regenerations ({shown}); their "
                         "target, data or sampling settings differ, so their shares would not fit together")
    indexes = sorted(report["part"]["index"] for report in parts.values())
    if indexes != list(range(len(parts))):
        raise AgentError(f"regenerate across hosts: shares {indexes} are not 0..{len(parts) - 1}")


def _read(group: Group, host: str, path: str) -> bytes:
    data = group.run_checked(host, ["sh", "-c", READ, "read", path], f"reading its answers {path}")
    if data and not data.endswith(b"\n"):
        raise AgentError(f"{host}: {path}: its last line is cut")
    return data


def _write(group: Group, host: str, path: str, data: bytes) -> None:
    group.run_checked(host, ["sh", "-c", WRITE, "write", path], f"writing the joined answers {path}", stdin=data)


def gather_answers(group: Group, parts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`parts`: each host's `step regenerate --part` report. Joins the shares in part order and writes
    the joined files on every host; what came from where."""
    same_regeneration(parts)
    order = sorted(parts, key=lambda name: parts[name]["part"]["index"])
    joined: dict[str, bytes] = {}
    shares: dict[str, dict[str, Any]] = {}
    for kind, _ in KINDS:
        pieces = []
        for host in order:
            data = _read(group, host, _path(host, parts[host]["share"][kind]))
            pieces.append(data)
            shares.setdefault(host, {"rows": parts[host]["part"]["rows"]})[kind] = data.count(b"\n")
        joined[kind] = b"".join(pieces)
    for host in order:
        for kind, key in KINDS:
            _write(group, host, _path(host, parts[host][key]), joined[kind])
    return {"shares": shares, "answers": joined["responses"].count(b"\n"), "failed": joined["errors"].count(b"\n"),
            "bytes": sum(len(data) for data in joined.values()) * len(order)}
