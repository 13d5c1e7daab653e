"""The subset of PEP 440 versions and specifiers that patch sets need, standard library only.

Supported operators: ==, !=, <, <=, >, >=, ~= and the `==X.*` / `!=X.*` prefix forms. Local versions
(`2.13.0+cpu`) match a specifier without a local part. Pre-releases are ordinary versions here (an
installed version is judged as it is), except that `<V` excludes pre-releases of V itself, as PEP 440 says.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_VERSION = re.compile(
    r"""^\s*v?
    (?:(?P<epoch>\d+)!)?
    (?P<release>\d+(?:\.\d+)*)
    (?:[-_.]?(?P<pre_l>a|b|c|rc|alpha|beta|pre|preview)[-_.]?(?P<pre_n>\d+)?)?
    (?:-(?P<post_n1>\d+)|[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>\d+)?)?
    (?:[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>\d+)?)?
    (?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?
    \s*$""",
    re.VERBOSE | re.IGNORECASE,
)
_PRE_RANK = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}


class InvalidVersion(ValueError):
    pass


@dataclass(frozen=True)
class Version:
    text: str
    epoch: int
    release: tuple[int, ...]
    pre: tuple[int, int] | None
    post: int | None
    dev: int | None
    local: tuple[int | str, ...] | None

    @classmethod
    def parse(cls, text: str) -> Version:
        match = _VERSION.match(text)
        if not match:
            raise InvalidVersion(f"not a PEP 440 version: {text!r}")
        pre = None
        if match["pre_l"]:
            pre = (_PRE_RANK[match["pre_l"].lower()], int(match["pre_n"] or 0))
        post = None
        if match["post_n1"] is not None:
            post = int(match["post_n1"])
        elif match["post_l"]:
            post = int(match["post_n2"] or 0)
        dev = int(match["dev_n"] or 0) if match["dev_l"] else None
        local = None
        if match["local"]:
            local = tuple(int(p) if p.isdigit() else p.lower() for p in re.split(r"[-_.]", match["local"]))
        return cls(text.strip(), int(match["epoch"] or 0),
                   tuple(int(p) for p in match["release"].split(".")), pre, post, dev, local)

    @property
    def is_prerelease(self) -> bool:
        return self.pre is not None or self.dev is not None

    def public(self) -> Version:
        return Version(self.text.split("+")[0], self.epoch, self.release, self.pre, self.post, self.dev, None)

    def key(self) -> tuple:
        release = list(self.release)
        while len(release) > 1 and release[-1] == 0:
            release.pop()
        # PEP 440 ordering: X.devN < X.aN < X < X.postN; local versions sort after the public one.
        if self.pre is None and self.post is None and self.dev is not None:
            pre_key: tuple = (0,)
        elif self.pre is None:
            pre_key = (2,)
        else:
            pre_key = (1, *self.pre)
        post_key = (0,) if self.post is None else (1, self.post)
        dev_key = (1,) if self.dev is None else (0, self.dev)
        local_key = () if self.local is None else tuple(
            (1, part, "") if isinstance(part, int) else (0, 0, part) for part in self.local)
        return (self.epoch, tuple(release), pre_key, post_key, dev_key, local_key)

    def __lt__(self, other: Version) -> bool:
        return self.key() < other.key()

    def __le__(self, other: Version) -> bool:
        return self.key() <= other.key()

    def __gt__(self, other: Version) -> bool:
        return self.key() > other.key()

    def __ge__(self, other: Version) -> bool:
        return self.key() >= other.key()

    def same(self, other: Version) -> bool:
        return self.key() == other.key()

    def __str__(self) -> str:
        return self.text


_CLAUSE = re.compile(r"^\s*(~=|==|!=|<=|>=|<|>)\s*([^\s,]+)\s*$")


@dataclass(frozen=True)
class Clause:
    op: str
    target: str

    def contains(self, version: Version) -> bool:
        if self.target.endswith(".*"):
            prefix = Version.parse(self.target[:-2])
            padded = version.release + (0,) * max(0, len(prefix.release) - len(version.release))
            matched = version.epoch == prefix.epoch and padded[: len(prefix.release)] == prefix.release
            return matched if self.op == "==" else not matched
        spec = Version.parse(self.target)
        candidate = version if spec.local is not None else version.public()
        if self.op == "==":
            return candidate.same(spec)
        if self.op == "!=":
            return not candidate.same(spec)
        if self.op == "<=":
            return candidate <= spec
        if self.op == ">=":
            return candidate >= spec
        if self.op == "<":
            if not spec.is_prerelease and version.is_prerelease and _base(version) == _base(spec):
                return False
            return candidate < spec
        if self.op == ">":
            if spec.post is None and version.post is not None and _base(version) == _base(spec):
                return False
            return candidate > spec and not candidate.public().same(spec)
        # ~=X.Y.Z means >=X.Y.Z and ==X.Y.*
        prefix = ".".join(str(p) for p in spec.release[:-1])
        return candidate >= spec and Clause("==", f"{spec.epoch}!{prefix}.*" if spec.epoch else f"{prefix}.*"
                                            ).contains(version)


def _base(version: Version) -> tuple[int, tuple[int, ...]]:
    """Epoch and release without trailing zeros: 0.17 and 0.17.0rc1 share a base."""
    release = list(version.release)
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    return version.epoch, tuple(release)


@dataclass(frozen=True)
class SpecifierSet:
    text: str
    clauses: tuple[Clause, ...]

    @classmethod
    def parse(cls, text: str) -> SpecifierSet:
        """Parse 'OP V[, OP V...]'; raises ValueError naming what is wrong."""
        if not text.strip():
            raise ValueError("empty specifier")
        clauses = []
        for part in text.split(","):
            match = _CLAUSE.match(part)
            if not match:
                raise ValueError(f"not a version specifier: {part.strip()!r}")
            op, target = match.groups()
            try:
                clauses.append(_clause(op, target, part.strip()))
            except InvalidVersion:
                raise ValueError(f"not a version specifier: {part.strip()!r}") from None
        return cls(text.strip(), tuple(clauses))

    def contains(self, version: str | Version) -> bool:
        parsed = Version.parse(version) if isinstance(version, str) else version
        return all(clause.contains(parsed) for clause in self.clauses)

    def __str__(self) -> str:
        return self.text


def _clause(op: str, target: str, written: str) -> Clause:
    if target.endswith(".*"):
        if op not in ("==", "!="):
            raise ValueError(f"'.*' only goes with == or !=: {written!r}")
        Version.parse(target[:-2])
    else:
        parsed = Version.parse(target)
        if op == "~=" and len(parsed.release) < 2:
            raise ValueError(f"~= needs at least two release numbers: {written!r}")
        if parsed.local is not None and op not in ("==", "!="):
            raise ValueError(f"a local version only goes with == or !=: {written!r}")
    return Clause(op, target)
