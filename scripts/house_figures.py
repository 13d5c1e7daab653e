"""The house's figures (issue 35), read from the sources with `ast`: run from a checkout's root.

    .venv/bin/python scripts/house_figures.py [ROOT]

- agent flag declarations: a hand-written builder's keyword in specops/contract/commandline.py (each also an
  `add_argument("--flag")` of the agent's parser: the round-trip test pairs them), `add_argument` calls
  with a literal --flag under src/specops, and `Flag(...)` entries of a command spec (one makes both);
- cross-flag rule checks: raises whose message says two flags go together or exclude each other;
- manifest sequences written out: calls of `.begin(`/`._begin(` on a manifest, Manifest.recorded's own
  included (each opens begin -> finish/fail);
- functions with `Any` in their signature, of all functions (src/, remote/, tasks.py);
- lines in src/ + remote/.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

RULE = re.compile(r"exclude each other|only with|with it\b|give --")


def sources(root: Path) -> list[Path]:
    return [root / "tasks.py", *sorted((root / "remote").rglob("*.py")), *sorted((root / "src").rglob("*.py"))]


def _any_in(node: ast.AST) -> bool:
    return any((isinstance(part, ast.Name) and part.id == "Any")
               or (isinstance(part, ast.Attribute) and part.attr == "Any") for part in ast.walk(node))


def _signature_has_any(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    arguments = function.args
    annotated = [a.annotation for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs,
                                        arguments.vararg, arguments.kwarg) if a is not None and a.annotation]
    return any(_any_in(annotation) for annotation in [*annotated, function.returns] if annotation is not None)


def _flag_literals(node: ast.Call) -> list[str]:
    return [arg.value for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
            and arg.value.startswith("--")]


def figures(root: Path) -> dict[str, object]:
    functions = with_any = rules = sequences = argparse_flags = spec_flags = 0
    for path in sources(root):
        text = path.read_text()
        tree = ast.parse(text, str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                functions += 1
                with_any += _signature_has_any(node)
            if isinstance(node, ast.Raise) and node.exc is not None:
                message = " ".join(part.value for part in ast.walk(node.exc)
                                   if isinstance(part, ast.Constant) and isinstance(part.value, str))
                if RULE.search(message) and "--" in message:
                    rules += 1
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                receiver = ast.unparse(node.func.value)
                if node.func.attr in ("begin", "_begin") and ("manifest" in receiver or (
                        receiver == "self" and path.name == "manifest.py")):
                    sequences += 1
                if node.func.attr == "add_argument" and "src" in path.parts:
                    argparse_flags += len(_flag_literals(node))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Flag":
                spec_flags += 1
    commandline = root / "src" / "specops" / "contract" / "commandline.py"
    if not commandline.exists():  # a checkout from before specops/contract/ (issue 41)
        commandline = root / "src" / "specops" / "commandline.py"
    builder_keywords = sum(len(node.args.kwonlyargs) for node in ast.parse(commandline.read_text()).body
                           if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"))
    lines = sum(len(path.read_text().splitlines()) for part in ("src", "remote")
                for path in (root / part).rglob("*.py"))
    return {"builder_keywords": builder_keywords, "argparse_flags": argparse_flags, "spec_flags": spec_flags,
            "cross_flag_rule_checks": rules, "manifest_sequences": sequences,
            "functions": functions, "functions_with_any": with_any, "lines_src_remote": lines}


if __name__ == "__main__":
    print(json.dumps(figures(Path(sys.argv[1]) if len(sys.argv) > 1 else Path.cwd()), indent=1))
