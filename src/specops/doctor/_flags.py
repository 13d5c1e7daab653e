"""Check 2: the flags specops will pass exist in the installed vLLM and speculators.

Flags are read statically from the sources that define them: literal `--flag` strings (argparse,
typer, click), the parameters of typer command functions, and the fields of the dataclasses and
config models that vLLM's EngineArgs and speculators' TrainConfig turn into flags.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from specops.analysis import ModuleIndex
from specops.doctor._report import Item, at_least


@dataclass(frozen=True)
class Command:
    label: str  # "vllm serve"
    package: str
    modules: tuple[str, ...]  # where its flags are defined
    settings_key: str  # the run setting holding the flags


COMMANDS = (
    # the server's own flags (--host, --port, ...) moved to entrypoints/launchers/cli_args.py in vLLM 0.32
    Command("vllm serve", "vllm", ("vllm.engine.arg_utils", "vllm.entrypoints.openai.cli_args",
                                   "vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.cli.serve"),
            "serve_flags"),
    Command("speculators prepare-data", "speculators", ("speculators.cli.prepare_data",), "prepare_flags"),
    Command("speculators generate-offline-data", "speculators", ("speculators.cli.generate_offline_data",),
            "generate_flags"),
    # Hidden-state backends register their own train flags (e.g. --hidden-states-path) from hs_connectors.
    Command("speculators train", "speculators", ("speculators.cli.train", "speculators.train.config",
                                                 "speculators.train.cli", "hs_connectors"), "train_flags"),
)


def flag_names(flags: list[str]) -> list[str]:
    """The option names in an argument list: `--a=1 --b 2 x` -> ['--a', '--b']."""
    return [token.split("=", 1)[0] for token in flags if token.startswith("--")]


def _normal(flag: str) -> str:
    return flag.replace("_", "-")


def defined_flags(index: ModuleIndex, modules: tuple[str, ...]) -> tuple[dict[str, str], list[str]]:
    """{normalised flag: where it is defined} over the modules (packages: all their files), and the
    modules that were not found."""
    found: dict[str, str] = {}
    missing: list[str] = []
    for module in modules:
        file = index.module_file(module)
        if file is None:
            missing.append(module)
            continue
        files = sorted(file.parent.rglob("*.py")) if file.name == "__init__.py" else [file]
        for path in files:
            _flags_in_file(index, path, found)
    return found, missing


def _flags_in_file(index: ModuleIndex, path: Path, found: dict[str, str]) -> None:
    tree = index.tree(path)
    if tree is None:
        return
    name = path.name
    uses_typer = "typer" in (index.text(path) or "") or "click" in (index.text(path) or "")
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("--"):
            flag = node.value.split("=", 1)[0].split()[0] if node.value.strip() != "--" else ""
            if len(flag) > 2:
                found.setdefault(_normal(flag), f"{name}:{node.lineno}")
        elif isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    field = "--" + _normal(stmt.target.id)
                    found.setdefault(field, f"{name}:{stmt.lineno} (field {node.name}.{stmt.target.id})")
                    found.setdefault("--no-" + field[2:], f"{name}:{stmt.lineno} (field {node.name}.{stmt.target.id})")
        elif uses_typer and isinstance(node, ast.FunctionDef):
            for arg in [*node.args.args, *node.args.kwonlyargs]:
                flag = "--" + _normal(arg.arg)
                found.setdefault(flag, f"{name}:{node.lineno} (parameter {node.name}({arg.arg}))")
                found.setdefault("--no-" + flag[2:], f"{name}:{node.lineno} (parameter {node.name}({arg.arg}))")


def check_flags(index: ModuleIndex, settings: dict[str, list[str]], versions: dict[str, str | None]) -> list[Item]:
    items: list[Item] = []
    for command in COMMANDS:
        flags = flag_names(settings.get(command.settings_key) or [])
        if not flags:
            continue
        version = versions.get(command.package)
        if version is None:
            items.append(Item("flags", "error", command.label, f"{command.package} is not installed",
                              f"install {command.package}"))
            continue
        defined, missing = defined_flags(index, command.modules)
        if len(missing) == len(command.modules):
            needs = " (the CLI arrived in speculators 0.5)" if command.package == "speculators" and not at_least(
                version, "0.5") else ""
            items.append(Item("flags", "error", command.label,
                              f"{command.package} {version} has no `{command.label}` command{needs}",
                              f"install a {command.package} release with `{command.label}`"))
            continue
        for flag in flags:
            where = defined.get(_normal(flag))
            if where:
                items.append(Item("flags", "ok", f"{command.label} {flag}", f"defined at {where}"))
            else:
                items.append(Item("flags", "error", f"{command.label} {flag}",
                                  f"{command.package} {version} defines no {flag} (read from "
                                  f"{', '.join(m for m in command.modules if m not in missing)})",
                                  f"drop {flag} or install a {command.package} that has it"))
    return items
