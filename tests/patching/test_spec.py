"""Reading patch sets: strict TOML with one clear line per mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from specops.contract.errors import BadInput
from specops.patching.spec import load_set, load_sets

SET = 'package = "demo"\nversion = ">=1.0,<2"\nhost = "cpu"\n[requires]\ntorch = ">=2.9"\n'
PATCH = """id = "first"
reason = "because"
module = "demo.core"

[[replace]]
old = '''
x = 1
'''
new = '''
x = 2
'''
"""


def make_set(folder: Path, set_text: str = SET, **patches: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "set.toml").write_text(set_text)
    for name, text in (patches or {"01-first.toml": PATCH}).items():
        (folder / name).write_text(text)
    return folder


def test_a_valid_set_reads_in_file_name_order(tmp_path: Path) -> None:
    folder = make_set(tmp_path / "demo-1", **{"02-second.toml": PATCH.replace('"first"', '"second"'),
                                              "01-first.toml": PATCH})
    patch_set = load_set(folder)

    assert (patch_set.name, patch_set.package, patch_set.host) == ("demo-1", "demo", "cpu")
    assert [p.id for p in patch_set.patches] == ["first", "second"]
    first = patch_set.patches[0]
    assert (first.replacements[0].old, first.replacements[0].new, first.replacements[0].count) == \
        ("x = 1\n", "x = 2\n", 1)
    assert first.checks == ("parses", "calls_bind", "imports_resolve")
    assert patch_set.requires["torch"].contains("2.13.0+cpu")
    assert patch_set.modules() == ["demo.core"]


@pytest.mark.parametrize(("set_text", "patch_text", "message"), [
    (SET.replace('host = "cpu"', 'host = "tpu"'), PATCH, "set.toml: key 'host' must be one of any, cpu, gpu"),
    (SET.replace('package = "demo"\n', ""), PATCH, "set.toml: key 'package' is missing"),
    (SET.replace(">=1.0,<2", ">=1.0;<2"), PATCH, "set.toml: key 'version': not a version specifier"),
    (SET.replace('torch = ">=2.9"', "torch = 2.9"), PATCH, "set.toml: key 'requires.torch' must be a str"),
    (SET, PATCH.replace('module = "demo.core"', 'module = "demo/core.py"'), "key 'module': 'demo/core.py'"),
    (SET, PATCH.replace('reason = "because"', 'reason = ""'), "key 'reason' must be one non-empty line"),
    (SET, PATCH.replace('id = "first"', 'id = "First Patch"'), "key 'id': 'First Patch' is not"),
    (SET, PATCH + 'checks = ["parses"]\n', "unknown key 'replace[1].checks'"),  # a key in the wrong table
    (SET, PATCH + "[broken\n", "not valid TOML"),
    (SET, PATCH.replace('module = "demo.core"', 'module = "demo.core"\nchecks = ["vibes"]'),
     "key 'checks': unknown check 'vibes'"),
    (SET, PATCH.replace("[[replace]]", "[[replace]]\ncount = 0"), "key 'replace[1].count' must be at least 1"),
    (SET, PATCH.replace("[[replace]]", "[[replace]]\nanchor = 'x'"), "unknown key 'replace[1].anchor'"),
    (SET, PATCH.split("[[replace]]")[0], "key 'replace' is missing"),
])
def test_mistakes_are_one_line_naming_file_and_key(tmp_path: Path, set_text: str, patch_text: str,
                                                   message: str) -> None:
    folder = make_set(tmp_path / "demo-1", set_text, **{"01-first.toml": patch_text})

    with pytest.raises(BadInput) as caught:
        load_set(folder)

    assert message in str(caught.value)
    assert str(caught.value).startswith(str(folder))
    assert "\n" not in str(caught.value)


def test_an_unknown_set_name_lists_the_sets_there_are(tmp_path: Path) -> None:
    make_set(tmp_path / "demo-1")

    with pytest.raises(BadInput, match=r"--set demo-2: no patch set named 'demo-2' .* \(have: demo-1\)"):
        load_sets(tmp_path, ["demo-2"])
