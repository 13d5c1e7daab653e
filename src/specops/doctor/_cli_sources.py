"""Where a release's command line defines a subcommand's flags, followed from the release's own entry point.

A list of module names holds only for the releases it was written against (vLLM 0.33 moved `vllm serve`'s
own flags from entrypoints/launchers/cli_args.py to entrypoints/common/cli_args.py, and a fixed list then
called `--port` "not defined"). Here the sources are found the way the command itself is built:

    console script (the distribution's entry_points.txt: `vllm = vllm.entrypoints.cli.main:main`)
      -> the modules that script's module imports (vLLM's CMD_MODULES; typer's `app.command(...)(fn)`)
      -> the subcommand: a class whose `name` is the subcommand (vLLM), or the registered function (typer)
      -> every function it calls with the parser (`make_arg_parser`, `X.add_cli_args`), resolved through
         imports and re-exports to wherever this release keeps them, a few levels deep
      -> the classes whose `add_cli_args` runs: their dataclass fields along their bases are flags.

Standard library only; nothing is imported. What could not be followed is listed as such: a flag missing
from sources that were not all followed is "unknown", never an error.
"""

from __future__ import annotations

import ast
import configparser
from dataclasses import dataclass, field
from pathlib import Path

from specops.analysis import DefTarget, ModuleIndex
from specops.host.installed import distributions, normalise

MAX_HOPS = 3  # calls followed below the subcommand's own parser set-up


@dataclass
class CliSources:
    """The files a subcommand's flags are defined in, the classes whose fields are flags, what was not followed."""

    script: str | None = None                  # "vllm = vllm.entrypoints.cli.main:main"
    files: list[Path] = field(default_factory=list)
    classes: list[DefTarget] = field(default_factory=list)
    functions: list[DefTarget] = field(default_factory=list)
    unfollowed: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.script is not None and not self.unfollowed and bool(self.files)


def console_script(search_path: list[str], distributions_named: tuple[str, ...], script: str) -> str | None:
    """`module:attr` of a console script, read from the first named distribution's entry_points.txt."""
    installed = distributions(search_path)
    for name in distributions_named:
        dist = installed.get(normalise(name))
        if dist is None:
            continue
        parser = configparser.ConfigParser(interpolation=None)
        parser.optionxform = str  # type: ignore[assignment,method-assign]
        try:
            parser.read(dist.dist_info / "entry_points.txt")
        except configparser.Error:
            return None
        if parser.has_option("console_scripts", script):
            return parser.get("console_scripts", script).split("[", 1)[0].strip()
    return None


def _imported_modules(tree: ast.Module, module: str, index: ModuleIndex) -> list[str]:
    """Every module `tree` imports, at any depth (vLLM imports its subcommand modules inside main())."""
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
            found += [f"{node.module}.{alias.name}" for alias in node.names
                      if index.module_file(f"{node.module}.{alias.name}") is not None]
    top = module.split(".")[0]
    return [name for name in dict.fromkeys(found) if name.split(".")[0] == top]


def _class_named(tree: ast.Module, subcommand: str) -> ast.ClassDef | None:
    """A class whose body says `name = "<subcommand>"` (vLLM's CLISubcommand)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for statement in node.body:
                if (isinstance(statement, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "name"
                                                              for t in statement.targets)
                        and isinstance(statement.value, ast.Constant) and statement.value.value == subcommand):
                    return node
    return None


def _typer_command(tree: ast.Module, module: str, subcommand: str, index: ModuleIndex) -> DefTarget | None:
    """The function registered as `subcommand` by `app.command(...)(fn)` (name= or the function's own name)."""
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Call) and node.args
                and isinstance(node.func.func, ast.Attribute) and node.func.func.attr == "command"):
            continue
        named = next((k.value.value for k in node.func.keywords if k.arg == "name"
                      and isinstance(k.value, ast.Constant)), None)
        function = node.args[0]
        if not isinstance(function, ast.Name):
            continue
        if (named or function.id.replace("_", "-")) != subcommand:
            continue
        found = index.expression(module, function)
        return found if isinstance(found, DefTarget) else None
    return None


def _called_targets(index: ModuleIndex, module: str, function: ast.AST) -> list[tuple[str, object]]:
    """(spelling, target) for each call in `function` to a module-level name or to an `add_cli_args` (a class's
    flags), resolved through this module's imports; an `add_cli_args` on anything else is (spelling, None)."""
    found: list[tuple[str, object]] = []
    for node in ast.walk(function):
        if not isinstance(node, ast.Call):
            continue
        callee = node.func
        if isinstance(callee, ast.Name):
            found.append((callee.id, index.expression(module, callee)))
        elif isinstance(callee, ast.Attribute) and callee.attr == "add_cli_args":
            resolvable = isinstance(callee.value, ast.Name | ast.Attribute)
            found.append((ast.unparse(callee), index.expression(module, callee) if resolvable else None))
    return found


def _follow_function(index: ModuleIndex, target: DefTarget, sources: CliSources, hops: int) -> None:
    if target in sources.functions:
        return
    sources.functions.append(target)
    file = index.module_file(target.module)
    if file is not None and file not in sources.files:
        sources.files.append(file)
    if hops >= MAX_HOPS:
        return
    top = target.module.split(".")[0]
    for spelling, callee in _called_targets(index, target.module, target.node):
        if isinstance(callee, DefTarget) and callee.module.split(".")[0] == top:
            if callee.node.name == "add_cli_args" and callee.owner is not None:
                _add_class(index, callee.owner, sources)
                _follow_function(index, callee, sources, hops + 1)
            elif not callee.is_class:
                _follow_function(index, callee, sources, hops + 1)
        elif spelling.endswith(".add_cli_args"):
            sources.unfollowed.append(f"{spelling} (called in {target.qualname})")


def _add_class(index: ModuleIndex, klass: DefTarget, sources: CliSources) -> None:
    for base in index.iter_mro(klass):
        if isinstance(base, DefTarget):
            if base not in sources.classes:
                sources.classes.append(base)
            file = index.module_file(base.module)
            if file is not None and file not in sources.files:
                sources.files.append(file)
        elif base.qualname.split(".")[0] == klass.module.split(".")[0]:
            sources.unfollowed.append(f"base class {base.qualname}: {base.reason}")


def subcommand_sources(index: ModuleIndex, search_path: list[str], distributions_named: tuple[str, ...],
                       script: str, subcommand: str) -> CliSources:
    """Follow `script subcommand` from the console script to the files and classes defining its flags."""
    sources = CliSources()
    entry = console_script(search_path, distributions_named, script)
    if entry is None:
        sources.unfollowed.append(f"no console script {script!r} in {' or '.join(distributions_named)}'s "
                                  "entry_points.txt")
        return sources
    sources.script = f"{script} = {entry}"
    module = entry.split(":", 1)[0]
    file = index.module_file(module)
    tree = index.tree(file) if file is not None else None
    if tree is None:
        sources.unfollowed.append(f"{module} (the console script's module) is not readable source")
        return sources
    command = _typer_command(tree, module, subcommand, index)
    if command is None:
        for name in [module, *_imported_modules(tree, module, index)]:
            candidate = index.module_file(name)
            candidate_tree = index.tree(candidate) if candidate is not None else None
            if candidate_tree is None:
                continue
            command = _typer_command(candidate_tree, name, subcommand, index)
            if command is not None:
                break
            klass = _class_named(candidate_tree, subcommand)
            if klass is not None:
                owner = DefTarget(name, klass)
                for method in klass.body:
                    if isinstance(method, ast.FunctionDef) and method.name in ("subparser_init", "add_cli_args"):
                        _follow_function(index, DefTarget(name, method, owner), sources, 0)
                if candidate not in sources.files:
                    sources.files.insert(0, candidate)
                return sources
    if command is None:
        sources.unfollowed.append(f"no `{subcommand}` subcommand found from {entry}")
        return sources
    # a typer command: its parameters are its flags; its config schema may add more (listed by the caller)
    _follow_function(index, command, sources, MAX_HOPS)
    return sources
