"""Hidden states host to host: every host's share of the files onto every host that lacks rows.

Over the verified connections a task already holds (remote.group.Group's sessions), through the
workstation: `tar` of the share's files out of the source host, unpacked on the destination into a
temporary folder beside the files and renamed in file by file, so a cut transfer never leaves a
half file under a final name (and the check that follows, `step extract --require-whole`, would
name one that arrived damaged). The file names are built here from row numbers; the folders are the
ones the hosts reported, quoted like every other argument.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from remote.errors import AgentError, BadInput
from specops.protocol import stays_inside

if TYPE_CHECKING:
    from remote.group import Group

# tar reads the names from stdin (a share of 100k rows would not fit in one argv)
UNPACK = ('set -e; mkdir -p "$1"; tmp=$(mktemp -d "$1/.incoming-XXXXXX"); trap \'rm -rf "$tmp"\' EXIT; '
          'tar -C "$tmp" -xf -; for entry in "$tmp"/hs_*.safetensors; do [ -e "$entry" ] || continue; '
          'mv -f "$entry" "$1/"; done')


def file_names(rows: list[int]) -> list[str]:
    names = [f"hs_{int(row)}.safetensors" for row in rows]
    for name in names:
        if not stays_inside(name) or "/" in name:
            raise BadInput(f"hidden-state file name {name!r} would leave its folder")
    return names


def check_folder(host: str, folder: object) -> str:
    if not isinstance(folder, str) or not folder.startswith("/"):
        raise AgentError(f"{host}: reported hidden-state folder {folder!r} is not an absolute path")
    return folder


def tar_out(group: Group, host: str, folder: str, rows: list[int]) -> bytes:
    names = "\n".join(file_names(rows)).encode() + b"\n"
    return group.run_checked(host, ["tar", "-C", folder, "-cf", "-", "-T", "-"],
                             f"tar of its hidden states in {folder}", stdin=names)


def tar_in(group: Group, host: str, folder: str, archive: bytes) -> None:
    group.run_checked(host, ["sh", "-c", UNPACK, "gather", folder], f"unpacking hidden states into {folder}",
                      stdin=archive)


def gather(group: Group, parts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`parts`: each host's `step extract --part` report (its folder and share). Copies every share to
    every other host whose own report says rows outside its share are not whole; what went where."""
    folders = {name: check_folder(name, report.get("output") or report.get("folder"))
               for name, report in parts.items()}
    lacking = [name for name, report in parts.items() if not report["part"]["others_whole"]]
    copies: list[dict[str, Any]] = []
    for source, report in parts.items():
        targets = [name for name in lacking if name != source]
        rows = [row for start, stop in report["part"]["spans"] for row in range(int(start), int(stop))]
        if not targets or not rows:
            continue
        archive = tar_out(group, source, folders[source], rows)
        for target in targets:
            tar_in(group, target, folders[target], archive)
        copies.append({"from": source, "to": targets, "files": len(rows), "bytes": len(archive)})
    return {"copies": copies, "bytes": sum(copy["bytes"] * len(copy["to"]) for copy in copies)}
