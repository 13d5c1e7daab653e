"""Calls on instances: `self.scheduler.schedule()` bound to `Scheduler.schedule`, and the attributes a
method uses on what it reaches through `self.x`, checked to exist.

Only receivers typed for certain reach a verdict: an exact instance (we read its constructor call)
lacking a name is an error; one typed from an annotation may be a subclass, so a lack is "unknown".
Receivers that cannot be typed are not counted at all: we do not know they are another package's.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from specops.analysis._checks import CallShape, Finding, _File, _reader, bind
from specops.analysis._index import DefTarget, ModuleIndex, top_level
from specops.analysis._signatures import Signature, SignatureReader, Unknown
from specops.analysis._types import Doubt, Instance, Member, Missing, Scope, TypeReader, Value

_WORD = re.compile(r"[a-z0-9]+")
_COMMON_WORDS = frozenset({"get", "set", "self", "the", "of", "to", "from", "is", "has"})


def types_of(index: ModuleIndex) -> TypeReader:
    reader = getattr(index, "_type_reader", None)
    if reader is None:
        from specops.analysis._registry import registry_class

        reader = TypeReader(index, lambda name: registry_class(index, name))
        index._type_reader = reader  # type: ignore[attr-defined]
    return reader


def method_signature(reader: SignatureReader, member: Member, qualname: str) -> Signature | Unknown:
    """The signature of a method called through an instance: `self` already bound."""
    node = member.node
    assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list)
    return reader._function(DefTarget(member.owner.module, node, member.owner), qualname=qualname,
                            drop_first=not static)


def rename_candidates(types: TypeReader, sigs: SignatureReader, value: Instance, missing: str,
                      call: ast.Call | None) -> list[tuple[str, str]]:
    """(name, signature) of methods that accept the same call and share a word with the missing name:
    what a rename with the same signature looks like from the caller's side."""
    words = set(_WORD.findall(missing.lower())) - _COMMON_WORDS
    found: list[tuple[int, str, str]] = []
    for name, member in types.names(value).items():
        if member.kind != "method" or name.startswith("__") or name == missing:
            continue
        shared = {w for w in _WORD.findall(name.lower()) if w not in _COMMON_WORDS
                  and any(w.startswith(x[:5]) or x.startswith(w[:5]) for x in words)}
        if not shared:
            continue
        signature = method_signature(sigs, member, f"{member.owner.qualname}.{name}")
        if not isinstance(signature, Signature):
            continue
        if call is not None and bind(signature, call)[0] == "error":
            continue
        found.append((len(shared), name, signature.describe()))
    found.sort(key=lambda item: -item[0])
    return [(name, described) for _, name, described in found[:2]]


def missing_detail(types: TypeReader, sigs: SignatureReader, value: Instance, name: str, why: str,
                   call: ast.Call | None) -> str:
    detail = why
    renamed = rename_candidates(types, sigs, value, name, call)
    if renamed:
        detail += "; renamed with the same signature? " + "; ".join(f"{n}: {d}" for n, d in renamed)
    return detail


def check_member_use(checked: _File, node: ast.Attribute, call: ast.Call | None, receivers: list[Value],
                     types: TypeReader, sigs: SignatureReader, label: str = "") -> Finding | None:
    """One `receiver.name` (or `receiver.name(...)`) against every typed receiver; None when none is typed."""
    instances = [v for v in receivers if isinstance(v, Instance)]
    if not instances:
        return None
    shown = call if call is not None else node
    results: list[tuple[str, str, str]] = []
    for value in instances:
        found = types.member(value, node.attr)
        qualname = f"{value.cls.qualname}.{node.attr}"
        if isinstance(found, Missing):
            results.append(("error", qualname, missing_detail(types, sigs, value, node.attr, found.reason, call)))
        elif isinstance(found, Doubt):
            results.append(("unknown", qualname, found.reason))
        elif call is None or found.kind != "method":
            results.append(("ok", qualname, f"{found.kind} of {found.owner.node.name} at "
                                             f"{types.index.relative_path(found.owner.module)}:{found.node.lineno}"))
        else:
            signature = method_signature(sigs, found, qualname)
            if isinstance(signature, Unknown):
                results.append(("unknown", qualname, signature.reason))
            else:
                status, reasons = bind(signature, call)
                results.append((status, signature.qualname, "; ".join([*reasons, signature.describe()])))
    # error only when every typed receiver errs; any doubt keeps it unknown
    statuses = {status for status, _, _ in results}
    status = "error" if statuses == {"error"} else "unknown" if "unknown" in statuses or "error" in statuses else "ok"
    chosen = next(r for r in results if r[0] == status) if status != "unknown" else next(
        (r for r in results if r[0] == "unknown"), results[0])
    detail = f"{label}{chosen[2]}"
    return Finding("attribute" if call is None else "call", status, str(checked.path), shown.lineno,
                   checked.code(shown), chosen[1], detail, CallShape.of(call) if call is not None else None)


def check_instance_calls(path: Path, index: ModuleIndex, *, packages: set[str]) -> list[Finding]:
    """Calls and attribute reads through `self.x...` in every method of every class in `path`, where
    the receiver is typed as an instance of a class from `packages`."""
    checked = _File(path, index)
    if checked.module is None:
        return []
    types, sigs = types_of(index), _reader(index)
    findings: list[Finding] = []
    for cls_node in [n for n in ast.walk(checked.tree) if isinstance(n, ast.ClassDef)]:
        me = Instance(DefTarget(checked.module, cls_node), exact=False)
        for method in [s for s in cls_node.body if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)]:
            findings.extend(_method_uses(checked, method, me, types, sigs, packages))
    return findings


def _method_uses(checked: _File, method: ast.FunctionDef | ast.AsyncFunctionDef, me: Instance, types: TypeReader,
                 sigs: SignatureReader, packages: set[str]) -> list[Finding]:
    scope = Scope(checked.module or "", me, method)
    calls = {id(n.func): n for n in ast.walk(method) if isinstance(n, ast.Call)}
    findings = []
    for node in ast.walk(method):
        if not (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)):
            continue
        receiver = node.value
        if not (isinstance(receiver, ast.Attribute) and _rooted_at(receiver, scope.self_name)):
            continue  # self.x.y...: the receiver is reached through an attribute of self
        receivers = [v for v in types.of_expr(receiver, scope) if isinstance(v, Instance)
                     and top_level(v.cls.module) in packages]
        if not receivers:
            continue
        finding = check_member_use(checked, node, calls.get(id(node)), receivers, types, sigs)
        if finding is not None:
            findings.append(finding)
    return findings


def _rooted_at(expr: ast.expr, name: str | None) -> bool:
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return isinstance(expr, ast.Name) and expr.id == name


__all__ = ["check_instance_calls", "check_member_use", "method_signature", "missing_detail",
           "rename_candidates", "types_of"]
