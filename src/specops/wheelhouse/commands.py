"""`python -m specops wheelhouse pack|assemble|install`: the serve env of a host without internet.

    pack      on a machine with the wheels (scripts/gpu-serve-env.sh downloads them): parts + manifest
    assemble  on the host, after any transfer: which parts are missing or damaged; once all check, the
              wheels unpacked (exit 1 while parts are missing: send those, run it again)
    install   assemble, then the wheels into an env made over the host's python (its torch)
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from specops.contract.errors import BadInput, CheckFailed, as_bad_input
from specops.wheelhouse import _bundle, _install

MIB = 1 << 20


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("wheelhouse", help="wheels carried in parts to a host without internet")
    verbs = parser.add_subparsers(dest="verb", required=True, parser_class=type(parser))
    pack = verbs.add_parser("pack", help="wheels -> parts checked by sha256 and a manifest")
    pack.add_argument("wheels", nargs="+", type=Path, help="wheel files, or folders of them")
    pack.add_argument("--out", type=Path, required=True, help="a new folder for the parts and manifest")
    pack.add_argument("--name", default="wheels", help="the parts' file stem")
    pack.add_argument("--part-mib", type=float, default=60.0, help="largest part, MiB (default 60)")
    pack.add_argument("--drop", action="append", default=[], metavar="DIST:GLOB",
                      help="leave out a wheel's members, e.g. vllm:vllm/vllm-rs (repeatable)")
    pack.add_argument("--fast", action="store_true", help="xz preset 6 instead of 9e (quicker, larger)")
    pack.set_defaults(handler=_pack)
    for verb in ("assemble", "install"):
        sub = verbs.add_parser(verb, help="check the parts here; unpack when all have arrived"
                               + ("; install into --env" if verb == "install" else ""))
        sub.add_argument("bundle", type=Path, help="the folder holding manifest.json and the parts")
        sub.add_argument("--from", dest="search", action="append", type=Path, default=[],
                         help="a folder a transfer left parts in (copied in after their check)")
        if verb == "install":
            sub.add_argument("--env", type=Path, required=True, help="the env (a venv; made if absent)")
            sub.add_argument("--python", default=None, help="the python the env is made over (default: this one)")
        sub.set_defaults(handler=_assemble if verb == "assemble" else _install_handler)


def _wheel_files(paths: list[Path]) -> list[Path]:
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files.extend(sorted(path.glob("*.whl")))
        elif path.is_file():
            files.append(path)
        else:
            raise BadInput(f"{path}: no such file or folder")
    names = [f.name for f in files]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise BadInput(f"{twice[0]}: named twice")
    for file in files:
        as_bad_input(_bundle.wheel_distribution, file)
    return files


def _pack(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    files = _wheel_files(args.wheels)
    drops = [as_bad_input(_bundle.Drop.parse, text) for text in args.drop]
    if not 0.001 <= args.part_mib <= 4096:
        raise BadInput(f"--part-mib {args.part_mib}: expected 0.001 to 4096")
    preset = 6 if args.fast else 9 | _bundle.lzma.PRESET_EXTREME
    manifest = as_bad_input(_bundle.pack, files, args.out, args.name, int(args.part_mib * MIB), drops, preset)
    return 0, {"ok": True, "bundle": str(args.out), "parts": manifest["parts"], "bytes": manifest["bytes"],
               "sha256": manifest["sha256"], "wheels": len(manifest["wheels"]),
               "dropped": {w["name"]: len(w["dropped"]) for w in manifest["wheels"] if w["dropped"]}}


def _assembled(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any], Path]:
    manifest = as_bad_input(_bundle.read_manifest, args.bundle)
    parts = _bundle.check_parts(args.bundle, manifest, args.search)
    if parts["missing"] or parts["damaged"]:
        raise CheckFailed(f"{args.bundle}: {len(parts['ok'])} of {len(manifest['parts'])} parts check; "
                          f"send again: {' '.join(parts['missing'] + parts['damaged'])}")
    try:
        wheels = _bundle.unpack(args.bundle, manifest)
    except ValueError as exc:
        raise CheckFailed(str(exc)) from None
    return manifest, parts, wheels


def _assemble(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    manifest, parts, wheels = _assembled(args)
    return 0, {"ok": True, "bundle": str(args.bundle), "parts": len(parts["ok"]), "wheels": str(wheels),
               "count": len(manifest["wheels"]), "sha256": manifest["sha256"]}


def _install_handler(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    manifest, _, wheels = _assembled(args)
    try:
        done = _install.install(wheels, manifest, args.env, args.python)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    except RuntimeError as exc:
        raise CheckFailed(str(exc)) from None
    return 0, {"ok": True, **done, "inventory": {"envs": {"serve": done["python"]}}}
