"""The engine-loop protocol: code that drives vLLM's scheduler and executor by hand must make the
calls the installed engine's own step makes (schedule -> execute -> sample -> update, as that
version spells it). The sequence is read from `EngineCore.step` in the installed source.

A step is a call `self.<receiver>.<method>(...)` in the step whose result is kept or which takes
a value an earlier step produced (`has_requests()` in a test is not a step). The receiver of the
first step (the scheduler) makes the work; the receiver that takes the first step's output (the
executor) does it and keeps state between its own calls, so a skipped executor step is an error,
and a skipped scheduler step (results never handed back) a warning: a capture-only caller that
aborts its requests after prefill may skip it on purpose.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from specops.analysis._index import DefTarget, ModuleIndex

ENGINE = "vllm.v1.engine.core.EngineCore"
STEP = "step"


@dataclass(frozen=True)
class Step:
    receiver: str  # the engine's attribute: "scheduler", "model_executor"
    method: str
    line: int
    code: str
    role: str  # "driver" | "worker"


@dataclass(frozen=True)
class Skipped:
    step: Step
    status: str  # "error" | "warn"
    file: str  # the caller
    line: int  # where the caller's loop is (its first step call)
    detail: str


def engine_steps(index: ModuleIndex) -> tuple[list[Step], str] | None:
    """The installed engine's step sequence and where it is read from, or None without one."""
    target = index.resolve(ENGINE)
    if not isinstance(target, DefTarget) or not target.is_class:
        return None
    method = next((s for s in target.node.body if isinstance(s, ast.FunctionDef) and s.name == STEP), None)
    if method is None:
        return None
    calls = sorted((n for n in ast.walk(method) if isinstance(n, ast.Call) and _self_attr_call(n)),
                   key=lambda n: (n.lineno, n.col_offset))
    produced: set[str] = set()
    steps: list[Step] = []
    kept = _kept_calls(method)
    first_output: set[str] = set()
    for call in calls:
        receiver, name = call.func.value.attr, call.func.attr  # type: ignore[attr-defined]
        uses = {n.id for n in ast.walk(call) if isinstance(n, ast.Name)}
        if id(call) not in kept and not (uses & produced):
            continue
        role = "driver" if not steps or receiver == steps[0].receiver else "worker"
        if steps and receiver != steps[0].receiver and not (uses & first_output):
            role = "worker" if any(s.receiver == receiver and s.role == "worker" for s in steps) else "driver"
        steps.append(Step(receiver, name, call.lineno, ast.unparse(call), role))
        names = kept.get(id(call), set())
        produced |= names
        if len(steps) == 1:
            first_output = names
    return steps, f"{index.relative_path(target.module)}:{method.lineno}"


def _self_attr_call(call: ast.Call) -> bool:
    func = call.func
    return (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Attribute)
            and isinstance(func.value.value, ast.Name) and func.value.value.id == "self")


def _kept_calls(method: ast.FunctionDef) -> dict[int, set[str]]:
    """{id(call): names its result is assigned to} for `x = self.a.b(...)`."""
    kept = {}
    for node in ast.walk(method):
        if isinstance(node, ast.Assign | ast.AnnAssign | ast.NamedExpr) and isinstance(node.value, ast.Call):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            kept[id(node.value)] = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return kept


def caller_calls(tree: ast.Module) -> dict[str, dict[str, list[int]]]:
    """{class name: {method called on a self attribute: [lines]}} for each class in a file."""
    found: dict[str, dict[str, list[int]]] = {}
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        calls: dict[str, list[int]] = {}
        for node in ast.walk(cls):
            if isinstance(node, ast.Call) and _self_attr_call(node):
                calls.setdefault(node.func.attr, []).append(node.lineno)  # type: ignore[attr-defined]
        found[cls.name] = calls
    return found


def check_engine_loop(path: Path, index: ModuleIndex) -> list[Skipped]:
    """Steps of the installed engine's loop that a class driving the scheduler and executor by hand
    never makes. A class drives the loop when it makes the first step and a worker step."""
    read = engine_steps(index)
    tree = index.tree(Path(path))
    if read is None or tree is None:
        return []
    steps, where = read
    if not steps:
        return []
    skipped = []
    for cls, calls in caller_calls(tree).items():
        made = [s for s in steps if s.method in calls]
        if steps[0] not in made or not any(s.role == "worker" for s in made):
            continue
        line = min(calls[steps[0].method])
        order = " -> ".join(s.method for s in steps)
        for step in steps:
            if step.method in calls:
                continue
            status = "error" if step.role == "worker" else "warn"
            consequence = ("the executor keeps state between its calls: the next execute_model finds the "
                           "previous step unfinished") if step.role == "worker" else (
                           "a scheduler-side step: harmless only where its output is not needed, as in "
                           "prefill-only capture that aborts its requests")
            skipped.append(Skipped(step, status, str(path), line,
                                   f"{cls} drives vLLM's engine loop by hand but never calls {step.method}: the "
                                   f"installed engine's step ({where}: {order}) calls `{step.code}` at line "
                                   f"{step.line}; {consequence}"))
    return skipped


__all__ = ["Skipped", "Step", "check_engine_loop", "engine_steps"]
