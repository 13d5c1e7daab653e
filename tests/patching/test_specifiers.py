"""PEP 440 versions and specifiers, the subset patch sets use."""

from __future__ import annotations

import pytest

from specops.patching.specifiers import InvalidVersion, SpecifierSet, Version


@pytest.mark.parametrize(("specifier", "version", "expected"), [
    ("==0.3.0", "0.3.0", True),
    ("==0.3", "0.3.0", True),
    ("==0.3.0", "0.3.1", False),
    ("!=0.3.0", "0.3.1", True),
    (">=0.12,<0.17", "0.12.0", True),
    (">=0.12,<0.17", "0.16.0", True),
    (">=0.12,<0.17", "0.11.2", False),
    (">=0.12,<0.17", "0.17.0", False),
    (">=0.12,<0.17", "0.17.0rc1", False),  # <V excludes V's own pre-releases
    ("<0.17", "0.16.99.dev1", True),
    ("<=0.16", "0.16.0", True),
    (">0.3", "0.3.post1", False),  # >V excludes V's post-releases
    (">0.3", "0.3.1", True),
    ("==2.13.0", "2.13.0+cpu", True),  # local version ignored by a public specifier
    ("==2.13.0+cpu", "2.13.0+cpu", True),
    ("==2.13.0+cpu", "2.13.0", False),
    (">=2.9", "2.13.0+cpu", True),
    ("~=0.4.0", "0.4.0.1", True),
    ("~=0.4.0", "0.5.0", False),
    ("~=2.1", "2.9", True),
    ("~=2.1", "3.0", False),
    ("==0.16.*", "0.16.3", True),
    ("==0.16.*", "0.160.0", False),
    ("!=0.16.*", "0.16.3", False),
    ("==1!1.0", "1.0", False),
])
def test_specifier_contains(specifier: str, version: str, expected: bool) -> None:
    assert SpecifierSet.parse(specifier).contains(version) is expected


def test_pep440_ordering() -> None:
    ordered = ["1.0.dev0", "1.0a1", "1.0b2", "1.0rc1", "1.0", "1.0+local", "1.0.post1", "1.1"]
    assert sorted(ordered, key=lambda v: Version.parse(v).key()) == ordered


@pytest.mark.parametrize(("text", "message"), [
    ("", "empty specifier"),
    ("0.3.0", "not a version specifier: '0.3.0'"),
    (">=0.12,<<0.17", "not a version specifier: '<<0.17'"),
    ("~=1", "~= needs at least two release numbers"),
    (">=0.16.*", "'.*' only goes with == or !="),
    (">=2.13+cpu", "a local version only goes with == or !="),
    ("==banana", "not a version specifier: '==banana'"),
])
def test_bad_specifiers_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("*", r"\*")):
        SpecifierSet.parse(text)


def test_a_bad_version_is_refused() -> None:
    with pytest.raises(InvalidVersion):
        Version.parse("not-a-version")
