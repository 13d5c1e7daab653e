"""speculators' HTTP contract with the vLLM server: the JSON keys it sends and the routes it calls, against the
request classes and routes the installed vLLM defines. Read from both sides' files, nothing imported.

speculators >= 0.5 imports nothing of vLLM: what breaks between releases is the wire. A request key vLLM's
request classes do not define is dropped or refused (pydantic), and `return_token_ids` renamed would leave
regenerate without the token ids it trains on. Found here:

- speculators' side: in its modules that speak HTTP (they import httpx, aiohttp, requests or openai), the
  keys of the request bodies a function builds (a dict literal bound to a name and that name's
  `body["key"] = ...`, when the name is posted: `post(url, json=body)`, `post_fn(payload)`), the keys of
  `extra_body={...}` and the keyword arguments of the OpenAI client's `.create(...)`; and the `/v1/...` route
  paths it formats into its URLs;
- vLLM's side: the annotated fields of every `*Request` class in its entrypoints' protocol modules (found by
  walking the installed package, not from a list), and the paths its routers declare (`@router.post("/v1/...")`).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from specops.analysis import ModuleIndex
from specops.doctor._report import Item

HTTP_CLIENTS = ("httpx", "aiohttp", "requests", "openai")
CLIENT_KEYWORDS = {"extra_body", "extra_headers", "extra_query", "timeout", "json", "stream"}
ROUTE = re.compile(r"/v1/[a-z_/]+")
ROUTE_METHODS = {"post", "get", "put", "delete", "api_route", "add_api_route", "websocket"}
POSTS = re.compile(r"(^|_)post($|_)")  # post, _post, post_fn, session.post; not set_postfix


@dataclass(frozen=True)
class Sent:
    key: str
    where: str  # file:line in speculators


def _speaks_http(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        if any(name.split(".")[0] in HTTP_CLIENTS for name in names):
            return True
    return False


def _constant_keys(node: ast.Dict) -> list[tuple[str, int]]:
    return [(key.value, key.lineno) for key in node.keys
            if isinstance(key, ast.Constant) and isinstance(key.value, str)]


def _function_sends(function: ast.AST, label: str) -> list[Sent]:
    """The request keys one function builds and hands to a call."""
    bodies: dict[str, list[tuple[str, int]]] = {}
    for node in ast.walk(function):
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Dict):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    bodies.setdefault(target.id, []).extend(_constant_keys(node.value))
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
                        and isinstance(target.slice, ast.Constant) and isinstance(target.slice.value, str)):
                    bodies.setdefault(target.value.id, []).append((target.slice.value, target.lineno))
    handed: set[str] = set()
    sent: list[Sent] = []
    for node in ast.walk(function):
        if not isinstance(node, ast.Call):
            continue
        called = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
        if POSTS.search(called.lower()):  # post(url, json=body), session.post(...), a post_fn(payload) handed in
            handed.update(arg.id for arg in node.args if isinstance(arg, ast.Name))
        for keyword in node.keywords:
            if isinstance(keyword.value, ast.Name) and keyword.arg == "json":
                handed.add(keyword.value.id)
            if keyword.arg == "extra_body" and isinstance(keyword.value, ast.Dict):
                sent += [Sent(key, f"{label}:{line}") for key, line in _constant_keys(keyword.value)]
        if isinstance(node.func, ast.Attribute) and node.func.attr == "create" and any(
                k.arg == "extra_body" for k in node.keywords):
            sent += [Sent(k.arg, f"{label}:{node.lineno}") for k in node.keywords
                     if k.arg and k.arg not in CLIENT_KEYWORDS]
    for name in handed & set(bodies):
        sent += [Sent(key, f"{label}:{line}") for key, line in bodies[name]]
    return sent


def sent_by(index: ModuleIndex, package: str = "speculators") -> tuple[list[Sent], dict[str, str]]:
    """(request keys, {route path: where}) of a client package's modules that speak HTTP."""
    root = index.module_file(package)
    if root is None:
        return [], {}
    sent: list[Sent] = []
    routes: dict[str, str] = {}
    for path in sorted(root.parent.rglob("*.py")):
        tree = index.tree(path)
        if tree is None or not _speaks_http(tree):
            continue
        label = _cited(index, path)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                sent += _function_sends(node, label)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                for route in ROUTE.findall(node.value):
                    routes.setdefault(route.rstrip("/"), f"{label}:{node.lineno}")
    unique = {(s.key, s.where): s for s in sent}
    return list(unique.values()), routes


def _cited(index: ModuleIndex, path: Path) -> str:
    name = index.module_name_of(path)
    return index.relative_path(name) if name else path.name


def served_by(index: ModuleIndex) -> tuple[dict[str, str], set[str]] | None:
    """({request field: where}, route paths) of the installed vLLM's entrypoints; None without vLLM."""
    file = index.module_file("vllm.entrypoints")
    if file is None:
        return None
    fields: dict[str, str] = {}
    routes: set[str] = set()
    for path in sorted(file.parent.rglob("*.py")):
        text = index.text(path) or ""
        if path.name.startswith("protocol") and "Request" in text:
            tree = index.tree(path)
            for klass in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)) if tree else ():
                if not klass.name.endswith("Request"):
                    continue
                for statement in klass.body:
                    if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                        fields.setdefault(statement.target.id,
                                          f"{_cited(index, path)}:{statement.lineno} ({klass.name})")
        if "/v1/" in text:
            routes.update(_declared_routes(index.tree(path)))
    return fields, routes


def _declared_routes(tree: ast.Module | None) -> set[str]:
    """Paths a module serves: the first argument of `@router.post("/v1/...")`, `add_api_route("/v1/...", ...)`."""
    found: set[str] = set()
    for node in ast.walk(tree) if tree is not None else ():
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ROUTE_METHODS
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                and node.args[0].value.startswith("/v1/")):
            found.add(node.args[0].value.rstrip("/"))
    return found


def http_items(index: ModuleIndex, versions: dict[str, str | None], client: str = "speculators") -> list[Item]:
    """One finding per request key and route a client sends that the installed vLLM does not define."""
    vllm, version = served_by(index), versions.get("vllm")
    if vllm is None or index.module_file(client) is None:
        return []
    fields, served_routes = vllm
    sent, routes = sent_by(index, client)
    if not fields:
        return [Item("serving", "unknown", "vllm/entrypoints", f"vLLM {version}: no *Request classes found in its "
                     "entrypoints' protocol modules", f"check {client}'s request keys against vLLM's by hand")]
    items: list[Item] = []
    for key in sorted({s.key for s in sent}):
        where = next(s.where for s in sent if s.key == key)
        if key not in fields:
            items.append(Item("serving", "error", where, f"{client} sends `{key}`, which no request class of vLLM "
                              f"{version} defines: dropped or refused by the server",
                              f"install the vLLM release {client} {versions.get(client)} was built against, or "
                              "patch the client for the field's new name"))
    for route, where in sorted(routes.items()):
        if served_routes and route not in served_routes:
            items.append(Item("serving", "error", where, f"{client} calls {route}, which vLLM {version}'s API "
                              "routers do not serve", f"install a vLLM that serves {route}"))
    if not items:
        items.append(Item("serving", "ok", f"{client} -> vllm (HTTP)", f"{len({s.key for s in sent})} request keys "
                          f"and {len(routes)} routes {client} uses are defined by vLLM {version}"))
    return items
