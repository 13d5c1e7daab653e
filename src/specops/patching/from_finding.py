"""`patch new --from-finding ID`: the patch a doctor finding calls for, proposed from source.

The finding is found again by its id in a fresh doctor pass over the installed stack; the call or import
at its line is edited in memory:

- an unexpected keyword is dropped;
- a missing required argument is passed: its value is read off `self` when an attribute of that name
  is reachable there (`self.vllm_config.cache_config.block_size`), else a marked placeholder;
- a callee that moved is imported from where it went; a method renamed with the same signature is
  called by its new name.

The edit becomes a patch file only after it replays exactly (dry run) and the edited source binds:
the index reads the edited text in place of the installed file, nothing is written to the package.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from specops.analysis import Instance, ModuleIndex, Scope, check_calls, check_imports, check_instance_calls, types_of
from specops.contract.errors import BadInput

PLACEHOLDER = "None  # specops: placeholder, derive {name} here"
_PROBLEM = re.compile(r"(unexpected keyword|missing required parameter) '(\w+)'")
_MOVED = re.compile(r"moved to ([\w.]+) \(")
_RENAMED = re.compile(r"renamed with the same signature\? (\w+)")


@dataclass(frozen=True)
class Proposal:
    module: str
    file: Path
    line: int
    before: str
    after: str
    patch_id: str
    reason: str


def find(document: dict, finding_id: str) -> dict:
    for finding in document.get("findings", []):
        if finding.get("id") == finding_id:
            return finding
    known = [f["id"] for f in document.get("findings", []) if f.get("result") == "error"]
    raise BadInput(f"--from-finding {finding_id}: no such finding in the doctor's report of this host "
                   f"(errors now: {', '.join(known) or 'none'})")


def propose(finding: dict, search_path: list[str] | None = None) -> Proposal:
    where = finding["where"]
    file_text, _, line_text = where.rpartition(":")
    if not line_text.isdigit() or not Path(file_text).is_file():
        raise BadInput(f"--from-finding {finding['id']}: points at {where}, not at a line of an installed file")
    path, line = Path(file_text).resolve(), int(line_text)
    index = ModuleIndex(search_path if search_path is not None else sys.path)
    module = index.module_name_of(path)
    if module is None:
        raise BadInput(f"--from-finding {finding['id']}: {path} is not importable from this interpreter's path")
    before = index.text(path) or ""
    tree = ast.parse(before)
    why = finding["why"]
    after, patch_id, reason = _edit(before, tree, line, why, index, module)
    return Proposal(module, path, line, before, after, patch_id, reason)


def _edit(before: str, tree: ast.Module, line: int, why: str, index: ModuleIndex, module: str
          ) -> tuple[str, str, str]:
    problems = _PROBLEM.findall(why)
    call = _call_at(tree, line)
    if problems and call is not None:
        text = before
        done = []
        for kind, name in reversed(problems):  # later edits first keeps earlier offsets valid
            if kind == "unexpected keyword":
                text = _drop_keyword(text, _call_at(ast.parse(text), line), name)
                done.append(f"drop {name}")
            else:
                value = _derived_value(index, module, ast.parse(text), line, name)
                text = _add_keyword(text, _call_at(ast.parse(text), line), name, value)
                done.append(f"pass {name}")
        callee = ast.unparse(call.func).rsplit(".", 1)[-1]
        steps = "; ".join(reversed(done))
        return text, _slug("-".join(reversed(done))), f"{callee}: {steps} ({why.split(' -> ')[-1][:160]})"
    moved = _MOVED.search(why)
    if moved and "has no name" in why:
        name = re.search(r"has no name '(\w+)'", why).group(1)  # type: ignore[union-attr]
        names = _moved_together(index, module, tree, name, moved.group(1))
        text = before
        for each in names:
            text = _move_import(text, ast.parse(text), each, moved.group(1))
        text = _merge_imports(text, moved.group(1), names)
        home = moved.group(1).rsplit(".", 1)[-1]
        return text, _slug(f"import-{name}-from-{home}" if len(names) == 1 else f"import-moved-from-{home}"), \
            f"{', '.join(names)} moved to {moved.group(1)}"
    renamed = _RENAMED.search(why)
    old = re.search(r"has no attribute '(\w+)'", why)
    if renamed and old:
        text = _rename_attribute(before, tree, line, old.group(1), renamed.group(1))
        return text, _slug(f"rename-{old.group(1)}-to-{renamed.group(1)}"), \
            f"{old.group(1)} was renamed {renamed.group(1)} with the same signature"
    raise BadInput(f"--from-finding: no patch can be proposed for this finding ({why[:160]}); write one with "
                   "--edited")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60]


def _call_at(tree: ast.Module, line: int) -> ast.Call | None:
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.lineno == line]
    return min(calls, key=lambda n: n.col_offset) if calls else None


def _offsets(text: str) -> list[int]:
    starts, total = [], 0
    for piece in text.splitlines(keepends=True):
        starts.append(total)
        total += len(piece)
    return [*starts, total]


def _at(starts: list[int], line: int, col: int) -> int:
    return starts[line - 1] + col  # ast columns are UTF-8 byte offsets: fine for ASCII sources


def _drop_keyword(text: str, call: ast.Call | None, name: str) -> str:
    keyword = next((k for k in call.keywords if k.arg == name), None) if call else None
    if keyword is None:
        raise BadInput(f"--from-finding: keyword {name} not found in the call")
    starts = _offsets(text)
    begin = _at(starts, keyword.lineno, keyword.col_offset)
    end = _at(starts, keyword.end_lineno, keyword.end_col_offset)  # type: ignore[arg-type]
    rest = text[end:]
    stripped = rest.lstrip(" ")
    followed = stripped.startswith(",")
    if followed:
        end += len(rest) - len(stripped) + 1
    line_start = starts[keyword.lineno - 1]
    if text[line_start:begin].strip() == "" and text[end:].startswith("\n"):
        return text[:line_start] + text[end + 1:]  # the keyword had its own line
    if followed:
        return text[:begin] + text[end:].lstrip(" ")
    comma = text.rindex(",", 0, begin)  # the last argument: the comma before it goes
    return text[:comma] + text[end:]


def _add_keyword(text: str, call: ast.Call | None, name: str, value: str) -> str:
    if call is None:
        raise BadInput("--from-finding: the call is gone")
    starts = _offsets(text)
    args = [*call.args, *call.keywords]
    closing = _at(starts, call.end_lineno, call.end_col_offset - 1)  # type: ignore[arg-type]
    if args and args[-1].end_lineno != call.end_lineno:  # one argument per line: add a line like them
        last = args[-1]
        indent = " " * last.col_offset
        after_last = _at(starts, last.end_lineno, last.end_col_offset)  # type: ignore[arg-type]
        line_end = text.index("\n", after_last)
        comma = "" if text[after_last:line_end].strip().startswith(",") else ","
        value_text = value.replace("  # ", ",  # ", 1) if "  # " in value else f"{value},"
        added = f"\n{indent}{name}={value_text}"
        return text[:after_last] + comma + text[after_last:line_end] + added + text[line_end:]
    separator = ", " if args else ""
    plain = value.split("  # ", 1)[0]
    edited = text[:closing] + f"{separator}{name}={plain}" + text[closing:]
    if "  # " in value:
        end_of_line = edited.index("\n", closing)
        edited = edited[:end_of_line] + "  # " + value.split("  # ", 1)[1] + edited[end_of_line:]
    return edited


def _derived_value(index: ModuleIndex, module: str, tree: ast.Module, line: int, name: str) -> str:
    """`self.a.b.<name>` when some attribute of `self` (two levels deep at most) has that name."""
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for method in (m for m in cls.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)):
            if not (method.lineno <= line <= (method.end_lineno or method.lineno)):
                continue
            from specops.analysis import DefTarget

            types = types_of(index)
            me = Instance(DefTarget(module, cls), exact=False)
            # only from attributes this method already reads by then: those surely exist there
            ready = {n.attr for n in ast.walk(method) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                     and n.value.id == "self" and isinstance(n.ctx, ast.Load) and n.lineno <= line}
            found = _reachable(types, Scope(module, me, method), "self", [me], name, depth=0, roots=ready)
            if found:
                return found
    return PLACEHOLDER.format(name=name)


def _stored(member) -> bool:
    """An attribute the instance keeps: not an InitVar (consumed by __init__) nor a ClassVar."""
    annotation = ast.unparse(member.annotation) if member.annotation is not None else ""
    return member.kind == "attribute" and not any(word in annotation for word in ("InitVar", "ClassVar"))


def _reachable(types, scope: Scope, spelled: str, values: list, name: str, depth: int,
               roots: set[str] | None = None) -> str | None:
    for value in values:
        if not isinstance(value, Instance):
            continue
        members = types.names(value)
        if depth > 0 and name in members and _stored(members[name]):
            return f"{spelled}.{name}"
        if depth >= 2:
            continue
        for attr, member in members.items():
            if not _stored(member) or attr.startswith("_") or (roots is not None and attr not in roots):
                continue
            inner = types.of_member(value, member)
            found = _reachable(types, scope, f"{spelled}.{attr}", inner, name, depth + 1)
            if found:
                return found
    return None


def _move_import(text: str, tree: ast.Module, name: str, new_module: str) -> str:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(a.name == name for a in node.names):
            starts = _offsets(text)
            begin, end = _at(starts, node.lineno, node.col_offset), _at(starts, node.end_lineno, node.end_col_offset)  # type: ignore[arg-type]
            kept = [a for a in node.names if a.name != name]
            alias = next(a for a in node.names if a.name == name)
            indent = " " * node.col_offset
            moved = f"from {new_module} import {name}" + (f" as {alias.asname}" if alias.asname else "")
            if not kept:
                return text[:begin] + moved + text[end:]
            statement = ast.ImportFrom(module=node.module, names=kept, level=node.level)
            rest = ast.unparse(statement)
            if len(rest) > 88:  # keep the parenthesised one-per-line style of long imports
                names = "".join(f"{indent}    {ast.unparse(a)},\n" for a in kept)
                rest = f"from {'.' * node.level}{node.module or ''} import (\n{names}{indent})"
            return text[:begin] + rest + f"\n{indent}" + moved + text[end:]
    raise BadInput(f"--from-finding: no import of {name} found")


def _moved_together(index: ModuleIndex, module: str, tree: ast.Module, name: str, new_module: str) -> list[str]:
    """The names of the same import statement that moved to the same module: one patch moves them all,
    so that patches made from their findings one by one never fight over one statement."""
    from specops.analysis import absolute_module, moved_definitions

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(a.name == name for a in node.names):
            source = absolute_module(module, index.is_package(module), node.level, node.module)
            together = []
            for alias in node.names:
                found = index.name_in_module(source, alias.name) if source else None
                if alias.name == name or (getattr(found, "missing", False) and any(
                        m.module == new_module for m in moved_definitions(index, f"{source}.{alias.name}"))):
                    together.append(alias.name)
            return together
    return [name]


def _merge_imports(text: str, new_module: str, names: list[str]) -> str:
    """`from M import a` / `from M import b` lines the moves added, as one statement."""
    lines = text.splitlines(keepends=True)
    added = [i for i, line in enumerate(lines) if re.fullmatch(rf"\s*from {re.escape(new_module)} import \w+\n", line)]
    if len(added) < 2:
        return text
    indent = lines[added[0]][: len(lines[added[0]]) - len(lines[added[0]].lstrip())]
    merged = f"{indent}from {new_module} import {', '.join(sorted(names))}\n"
    if len(merged) > 100:
        merged = f"{indent}from {new_module} import (\n" + "".join(f"{indent}    {n},\n" for n in sorted(names)) + \
            f"{indent})\n"
    kept = [line for i, line in enumerate(lines) if i not in added[1:]]
    kept[added[0]] = merged
    return "".join(kept)


def _rename_attribute(text: str, tree: ast.Module, line: int, old: str, new: str) -> str:
    starts = _offsets(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == old and node.lineno == line:
            end = _at(starts, node.end_lineno, node.end_col_offset)  # type: ignore[arg-type]
            return text[: end - len(old)] + new + text[end:]
    raise BadInput(f"--from-finding: no .{old} on line {line}")


def still_broken(proposal: Proposal, search_path: list[str] | None = None) -> list[str]:
    """What in the edited file does not bind, read with the edited text in place of the installed one."""
    index = ModuleIndex(search_path if search_path is not None else sys.path)
    index._texts[proposal.file] = proposal.after  # the index reads this instead of the installed file
    changed = _changed_lines(proposal.before, proposal.after)
    lines = changed | {proposal.line}
    found = [*check_calls(proposal.file, index, only_lines=lines),
             *check_imports(proposal.file, index, only_lines=lines),
             *[f for f in check_instance_calls(proposal.file, index, packages={"vllm"}) if f.line in lines]]
    return [f"line {f.line}: {f.code} -> {f.detail[:200]}" for f in found if f.status == "error"]


def _changed_lines(before: str, after: str) -> set[int]:
    import difflib

    lines: set[int] = set()
    matcher = difflib.SequenceMatcher(None, before.splitlines(), after.splitlines(), autojunk=False)
    for tag, _i1, _i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            lines.update(range(j1 + 1, max(j2, j1 + 1) + 1))
    return lines
