"""The inventory: which hosts exist, how to reach them, where their ML envs and workdirs are.

Loaded from `inventory.yaml` at the repository root, or from `$SPECOPS_INVENTORY`. Validation is
strict (unknown keys, wrong types, out-of-range numbers, dangling references) and every problem is
one line naming the file, the host and the key. Plain dataclasses and a table of field rules, not
pydantic: every task loads the inventory, and pydantic's import alone was most of a task's start-up.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remote.errors import BadInput
from specops.contract.commandline import SERVE_PYTHON_ENV
from specops.contract.protocol import name_problem

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_INVENTORY = REPO_ROOT / "inventory.yaml"


class InvalidValue(ValueError):
    """One key's value is wrong; the message says what is wrong (the caller adds file and key)."""


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidValue(f"must be a string, got {type(value).__name__} {value!r}")
    return value


def _optional_text(value: Any) -> str | None:
    return None if value is None else _text(value)


def _not_empty(value: Any) -> str:
    if not _text(value).strip():
        raise InvalidValue("must not be empty")
    return value


def _whole(value: Any, low: int | None = None, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise InvalidValue(f"must be a whole number, got {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise InvalidValue(f"must be a whole number, got {value!r}") from None
    if (low is not None and number < low) or (high is not None and number > high):
        span = f">= {low}" if high is None else f"between {low} and {high}"
        raise InvalidValue(f"must be {span}, got {number}")
    return number


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InvalidValue(f"must be a number of seconds, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise InvalidValue(f"must be a number of seconds, got {value!r}") from None
    if not number > 0 or math.isinf(number):
        raise InvalidValue(f"must be > 0, got {value!r}")
    return number


# The connection kinds' names: each is an object in remote.ssh.kinds (KINDS), which owns how the host is
# reached (commands, copies, its address); a test holds the two lists equal.
CONNECTIONS = ("ssh", "local")


def _connection(value: Any) -> str:
    if value not in CONNECTIONS:
        raise InvalidValue(f"must be {' or '.join(map(repr, CONNECTIONS))}, got {value!r}")
    return value


def _port(value: Any) -> int | None:
    return None if value is None else _whole(value, 1, 65535)


def _address(value: Any) -> str | None:
    """An IP address literal: torchrun binds it and the agent finds the interface that holds it."""
    if value is None:
        return None
    import ipaddress

    try:
        return str(ipaddress.ip_address(_text(value).strip()))
    except ValueError:
        raise InvalidValue(f"must be an IP address of the host on its training network, got {value!r}") from None


def _interface(value: Any) -> str | None:
    """A network interface name as Linux allows it (IFNAMSIZ: at most 15 bytes, no '/' or spaces)."""
    if value is None:
        return None
    name = _text(value)
    if not 0 < len(name) <= 15 or not all(char.isalnum() or char in "._-:@" for char in name):
        raise InvalidValue(f"must be a network interface name (up to 15 letters, digits, '._-:@'), got {value!r}")
    return name


def _envs(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise InvalidValue("must be a mapping of role to interpreter path")
    for role, python in value.items():
        if not isinstance(role, str) or not isinstance(python, str) or not python.strip():
            raise InvalidValue(f"{role}: must be a non-empty interpreter path")
    return dict(value)


@dataclass(frozen=True)
class Host:
    workdir: str
    python: str  # interpreter of the host's default ML env
    name: str = ""  # filled from the mapping key
    connection: str = "ssh"  # one of CONNECTIONS: its kind (remote.ssh.kind_of) says how the host is reached
    address: str | None = None  # hostname, IP or an alias from ~/.ssh/config
    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    known_hosts: str = "~/.ssh/known_hosts"
    jump: str | None = None  # another inventory host name, or user@host[:port]
    envs: dict[str, str] = field(default_factory=dict)  # more envs by role, e.g. serve, train
    gpus: int = 0
    run: str = "tiny"  # default run config (runs/<run>.yaml)
    connect_timeout: float = 10.0
    # Seconds without any sign of life from the host (command output or an answer to a keepalive
    # request, sent while a command is quiet) before the connection is declared dead. A quiet but
    # healthy command is never affected.
    channel_timeout: float = 30.0
    # The training network, for a training across hosts: the address this host's node binds and
    # advertises (torchrun --local-addr; the first host's is the rendezvous endpoint) and the
    # interface of its collectives (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME; found from the address
    # on the host when left out). Unset: torch's own guess from the hostname.
    train_address: str | None = None
    train_interface: str | None = None

    def __post_init__(self) -> None:
        # Direct construction (a jump host built from `user@host:port`) gets the same checks as a file.
        for key, rule in _RULES.items():
            try:
                object.__setattr__(self, key, rule(getattr(self, key)))
            except InvalidValue as exc:
                raise BadInput(f"host {self.name or '?'}: {key}: {exc}") from None
        if self.connection == "ssh" and not self.address:
            raise BadInput(f"host {self.name or '?'}: address: required for connection: ssh")

    def env_python(self, role: str | None = None) -> str:
        """The interpreter for an env role ('serve', 'train', ...); the default env otherwise."""
        if role and role in self.envs:
            return self.envs[role]
        return self.python

    def job_env(self) -> dict[str, str]:
        """What every agent job of a run gets from this host: its serve env (envs.serve) as SPECOPS_SERVE_PYTHON.
        Every job, not a chosen few: a step runs the steps it reads (prepare runs regenerate, which may serve),
        and each judges vLLM where the run's server runs."""
        return {SERVE_PYTHON_ENV: self.envs["serve"]} if "serve" in self.envs else {}


_RULES: dict[str, Callable[[Any], Any]] = {
    "workdir": _not_empty, "python": _not_empty, "name": _text, "connection": _connection,
    "address": _optional_text, "user": _optional_text, "port": _port, "identity_file": _optional_text,
    "known_hosts": _text, "jump": _optional_text, "envs": _envs, "gpus": lambda value: _whole(value, 0),
    "run": _not_empty, "connect_timeout": _seconds, "channel_timeout": _seconds,
    "train_address": _address, "train_interface": _interface,
}
_REQUIRED = {item.name for item in dataclasses.fields(Host)
             if item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING}


@dataclass(frozen=True)
class Inventory:
    default: str
    hosts: dict[str, Host]
    path: Path = Path("inventory.yaml")

    def host(self, name: str | None) -> Host:
        chosen = name or self.default
        if chosen not in self.hosts:
            known = ", ".join(sorted(self.hosts))
            raise BadInput(f"{self.path}: hosts: no host named {chosen!r} (known: {known})")
        return self.hosts[chosen]


def inventory_path() -> Path:
    return Path(os.environ.get("SPECOPS_INVENTORY") or DEFAULT_INVENTORY)


def _resolve_local_paths(raw_host: dict, base: Path) -> dict:
    """Relative workdir/python/envs of a local host are relative to the inventory file."""
    resolved = dict(raw_host)
    for key in ("workdir", "python"):
        value = resolved.get(key)
        if isinstance(value, str) and value and not os.path.isabs(os.path.expanduser(value)):
            resolved[key] = str(base / value)
    envs = resolved.get("envs")
    if isinstance(envs, dict):
        resolved["envs"] = {
            role: str(base / path) if isinstance(path, str) and not os.path.isabs(path) else path
            for role, path in envs.items()
        }
    return resolved


def _host(path: Path, name: str, settings: dict) -> Host:
    """One host from its settings, or BadInput naming the file, the host and the first wrong key."""
    where = f"{path}: hosts.{name}"
    for key in settings:
        if key not in _RULES or key == "name":
            hint = " (the mapping key is the name)" if key == "name" else ""
            raise BadInput(f"{where}.{key}: unknown key{hint}")
    for key in sorted(_REQUIRED - set(settings)):
        raise BadInput(f"{where}.{key}: required key is missing")
    values: dict[str, Any] = {"name": name}
    for key, value in settings.items():
        try:
            values[key] = _RULES[key](value)
        except InvalidValue as exc:
            raise BadInput(f"{where}.{key}: {exc}") from None
    if values.get("connection", "ssh") == "ssh" and not values.get("address"):
        raise BadInput(f"{where}.address: required for connection: ssh")
    return Host(**values)


def _read_yaml(path: Path) -> Any:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: the same rules, faster
    try:
        return yaml.load(path.read_text(), Loader=loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise BadInput(f"{path}:{where} not valid YAML: {getattr(exc, 'problem', exc)}") from None


def load_inventory(path: Path | None = None) -> Inventory:
    path = Path(path) if path else inventory_path()
    if not path.exists():
        raise BadInput(f"{path}: inventory file not found (set SPECOPS_INVENTORY or create it)")
    raw = _read_yaml(path)
    if not isinstance(raw, dict):
        raise BadInput(f"{path}: expected a mapping with keys 'default' and 'hosts'")
    hosts = raw.get("hosts")
    if not isinstance(hosts, dict) or not hosts:
        raise BadInput(f"{path}: hosts: must be a non-empty mapping of host name to settings")
    unknown_top = set(raw) - {"default", "hosts"}
    if unknown_top:
        raise BadInput(f"{path}: {sorted(unknown_top)[0]}: unknown key (expected 'default' and 'hosts')")
    base = path.resolve().parent
    prepared: dict[str, Host] = {}
    for name, settings in hosts.items():
        problem = name_problem(name)  # a host's name becomes logs/<host>/ and fetched/<host>/
        if problem is not None:
            raise BadInput(f"{path}: hosts: host name {problem}")
        if not isinstance(settings, dict):
            raise BadInput(f"{path}: hosts.{name}: must be a mapping of settings")
        if settings.get("connection") == "local":
            settings = _resolve_local_paths(settings, base)
        prepared[str(name)] = _host(path, str(name), settings)
    default = raw.get("default")
    if not isinstance(default, str):
        raise BadInput(f"{path}: default: required: the name of a host")
    inventory = Inventory(default=default, hosts=prepared, path=path)
    if inventory.default not in inventory.hosts:
        raise BadInput(f"{path}: default: names no host ({inventory.default!r}; hosts: "
                       f"{', '.join(sorted(inventory.hosts))})")
    for host in inventory.hosts.values():
        problem = name_problem(host.run)
        if problem is not None:
            raise BadInput(f"{path}: hosts.{host.name}.run: {problem}")
        if host.jump and "@" not in host.jump and host.jump not in inventory.hosts:
            raise BadInput(f"{path}: hosts.{host.name}.jump: names no inventory host ({host.jump!r}); "
                           "use another host's name or user@host[:port]")
    return inventory
