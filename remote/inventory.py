"""The inventory: which hosts exist, how to reach them, where their ML envs and workdirs are.

Loaded from `inventory.yaml` at the repository root, or from `$SPECOPS_INVENTORY`. Validation is
strict (unknown keys, wrong types, dangling references) and every problem is one line naming
the file, the host and the key.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from remote.errors import BadInput
from specops.protocol import name_problem

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_INVENTORY = REPO_ROOT / "inventory.yaml"


class Host(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = ""  # filled from the mapping key
    connection: Literal["ssh", "local"] = "ssh"
    address: str | None = None  # hostname, IP or an alias from ~/.ssh/config
    user: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    identity_file: str | None = None
    known_hosts: str = "~/.ssh/known_hosts"
    jump: str | None = None  # another inventory host name, or user@host[:port]
    workdir: str
    python: str  # interpreter of the host's default ML env
    envs: dict[str, str] = Field(default_factory=dict)  # more envs by role, e.g. serve, train
    gpus: int = Field(default=0, ge=0)
    run: str = "tiny"  # default run config (runs/<run>.yaml)
    connect_timeout: float = Field(default=10.0, gt=0)
    # Seconds without any sign of life from the host (command output or an answer to a keepalive
    # request, sent while a command is quiet) before the connection is declared dead. A quiet but
    # healthy command is never affected.
    channel_timeout: float = Field(default=30.0, gt=0)

    @field_validator("workdir", "python")
    @classmethod
    def _not_empty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value

    @model_validator(mode="after")
    def _ssh_needs_address(self) -> Host:
        if self.connection == "ssh" and not self.address:
            raise ValueError("address: required for connection: ssh")
        return self

    @property
    def is_local(self) -> bool:
        return self.connection == "local"

    def env_python(self, role: str | None = None) -> str:
        """The interpreter for an env role ('serve', 'train', ...); the default env otherwise."""
        if role and role in self.envs:
            return self.envs[role]
        return self.python

    def all_envs(self) -> dict[str, str]:
        return {"default": self.python, **self.envs}


class Inventory(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

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


def _location(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc)


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


def load_inventory(path: Path | None = None) -> Inventory:
    path = Path(path) if path else inventory_path()
    if not path.exists():
        raise BadInput(f"{path}: inventory file not found (set SPECOPS_INVENTORY or create it)")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise BadInput(f"{path}:{where} not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(raw, dict):
        raise BadInput(f"{path}: expected a mapping with keys 'default' and 'hosts'")
    hosts = raw.get("hosts")
    if not isinstance(hosts, dict) or not hosts:
        raise BadInput(f"{path}: hosts: must be a non-empty mapping of host name to settings")
    base = path.resolve().parent
    prepared: dict[str, object] = {}
    for name, settings in hosts.items():
        problem = name_problem(name)  # a host's name becomes logs/<host>/ and fetched/<host>/
        if problem is not None:
            raise BadInput(f"{path}: hosts: host name {problem}")
        if not isinstance(settings, dict):
            raise BadInput(f"{path}: hosts.{name}: must be a mapping of settings")
        if "name" in settings:
            raise BadInput(f"{path}: hosts.{name}.name: unknown key (the mapping key is the name)")
        if settings.get("connection", "ssh") == "ssh" and not settings.get("address"):
            raise BadInput(f"{path}: hosts.{name}.address: required for connection: ssh")
        if settings.get("connection") == "local":
            settings = _resolve_local_paths(settings, base)
        prepared[str(name)] = {**settings, "name": str(name)}
    unknown_top = set(raw) - {"default", "hosts"}
    if unknown_top:
        raise BadInput(f"{path}: {sorted(unknown_top)[0]}: unknown key (expected 'default' and 'hosts')")
    try:
        inventory = Inventory(default=raw.get("default"), hosts=prepared, path=path)
    except ValidationError as exc:
        first = exc.errors()[0]
        location = _location(first["loc"])
        message = first["msg"]
        if first["type"] == "extra_forbidden":
            message = "unknown key"
        elif first["type"] == "missing":
            message = "required key is missing"
        raise BadInput(f"{path}: {location}: {message}") from None
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
