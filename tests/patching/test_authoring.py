"""`patch new`: turning an edit into unique replacements, and writing them as TOML that reads back."""

from __future__ import annotations

import tomllib

from specops.patching.authoring import render, replacements, toml_string

SOURCE = "".join(f"def f{i}():\n    return None\n\n" for i in range(4))


def test_each_hunk_grows_context_until_its_old_text_is_unique() -> None:
    edited = SOURCE.replace("def f2():\n    return None\n", "def f2():\n    return 2\n")

    [(old, new)] = replacements(SOURCE, edited)

    assert SOURCE.count(old) == 1 and "def f2():" in old
    assert SOURCE.replace(old, new) == edited


def test_neighbouring_hunks_merge_and_distant_ones_stay_apart() -> None:
    edited = SOURCE.replace("def f0():", "def g0():").replace("def f3():", "def g3():")

    pairs = replacements(SOURCE, edited)

    assert len(pairs) == 2
    result = SOURCE
    for old, new in pairs:
        assert result.count(old) == 1
        result = result.replace(old, new)
    assert result == edited


def test_an_insertion_gets_context_to_anchor_it() -> None:
    edited = SOURCE.replace("def f1():\n", "def f1():\n    print('hi')\n")

    [(old, new)] = replacements(SOURCE, edited)

    assert old.strip() and SOURCE.replace(old, new) == edited


def test_toml_strings_read_back_exactly() -> None:
    for text in ["    x = 1\n", "quote ''' inside\n", "ends with '", "tab\tand \\ backslash\n", "bell\x07\n"]:
        assert tomllib.loads(f"v = {toml_string(text)}\n")["v"] == text


def test_rendered_patch_is_valid_toml_with_the_pairs() -> None:
    document = tomllib.loads(render("an-id", "a reason", "pkg.mod", [("a\n", "b\n"), ("c\n", "d\n")]))

    assert document["id"] == "an-id" and document["module"] == "pkg.mod"
    assert [(r["old"], r["new"], r["count"]) for r in document["replace"]] == [("a\n", "b\n", 1), ("c\n", "d\n", 1)]
