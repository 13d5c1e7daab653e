"""Calls bound to signatures read from small generated source trees."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from specops.analysis import Finding, ModuleIndex, check_calls, check_imports


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for relative, source in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    return root


def calls(tmp_path: Path, files: dict[str, str], caller: str, **options) -> list[Finding]:
    write_tree(tmp_path, {**files, "app/__init__.py": "", "app/main.py": caller})
    return check_calls(tmp_path / "app/main.py", ModuleIndex([str(tmp_path)]), **options)


def only(findings: list[Finding]) -> Finding:
    assert len(findings) == 1, findings
    return findings[0]


def test_a_required_dataclass_initvar_left_out_is_an_error(tmp_path: Path) -> None:
    lib = {"lib/__init__.py": "", "lib/config.py": """
        from dataclasses import InitVar, dataclass

        @dataclass
        class Config:
            max_len: InitVar[int]
            is_encoder_decoder: InitVar[bool]
            seqs: int = 8
    """}
    found = only(calls(tmp_path, lib, "from lib.config import Config\nConfig(max_len=4, seqs=2)\n"))
    assert (found.status, found.line, found.callee) == ("error", 2, "lib.config.Config")
    assert "missing required parameter 'is_encoder_decoder'" in found.detail
    assert "lib/config.py:5" in found.detail


def test_a_dataclass_call_with_every_initvar_binds(tmp_path: Path) -> None:
    lib = {"lib/__init__.py": "", "lib/config.py": """
        from dataclasses import InitVar, dataclass

        @dataclass
        class Config:
            max_len: InitVar[int]
            seqs: int = 8
    """}
    assert only(calls(tmp_path, lib, "from lib.config import Config\nConfig(4, seqs=2)\n")).status == "ok"


def test_dataclass_fields_follow_inheritance_init_false_and_keyword_only(tmp_path: Path) -> None:
    lib = {"lib/__init__.py": "", "lib/base.py": """
        import dataclasses
        from dataclasses import KW_ONLY, dataclass, field

        @dataclass
        class Base:
            a: int
            derived: int = field(init=False)
            items: list = field(default_factory=list)

        @dataclass
        class Child(Base):
            b: int = 0
            _: KW_ONLY
            flag: bool = False
            name: str = dataclasses.field(default="x")
    """}
    caller = """
        from lib.base import Child
        Child(1, [], 2)
        Child(1, [], 2, True)
        Child(1, derived=3)
        Child(b=2, flag=True)
    """
    found = calls(tmp_path, lib, caller)
    assert [f.status for f in found] == ["ok", "error", "error", "error"]
    assert "too many positional arguments: 4 given, at most 3" in found[1].detail
    assert "unexpected keyword 'derived'" in found[2].detail
    assert "missing required parameter 'a'" in found[3].detail


def test_a_class_without_init_takes_the_inherited_one_from_another_module(tmp_path: Path) -> None:
    lib = {"lib/__init__.py": "", "lib/base.py": """
        class Base:
            def __init__(self, vllm_config, block_size, *, log_stats=False):
                pass
    """, "lib/child.py": """
        from .base import Base as _Base

        class Scheduler(_Base):
            supports_pp = True
    """}
    found = only(calls(tmp_path, lib, "from lib.child import Scheduler\nScheduler(object(), log_stats=True)\n"))
    assert found.status == "error"
    assert "missing required parameter 'block_size'" in found.detail
    assert "lib/base.py:3 (Base.__init__)" in found.detail


def test_re_export_chains_through_star_imports_and_all_are_followed(tmp_path: Path) -> None:
    lib = {
        "lib/__init__.py": "from ._api import *\n",
        "lib/_api.py": "from .deep.impl import build as make_config\n__all__ = ['make_config']\n",
        "lib/deep/__init__.py": "",
        "lib/deep/impl.py": "def build(model, *, dtype='auto'):\n    return model\n",
    }
    found = only(calls(tmp_path, lib, "import lib as L\nL.make_config('m', kv_cache_specs=1)\n"))
    assert (found.status, found.callee) == ("error", "lib.deep.impl.build")
    assert "unexpected keyword 'kv_cache_specs'" in found.detail


def test_a_callee_with_star_args_accepts_anything(tmp_path: Path) -> None:
    lib = {"lib/__init__.py": "def anything(first, *args, **kwargs):\n    pass\n"}
    assert only(calls(tmp_path, lib, "import lib\nlib.anything(1, 2, 3, x=4)\n")).status == "ok"


def test_star_arguments_at_the_call_site_leave_what_they_may_bind_unknown(tmp_path: Path) -> None:
    lib = {"lib/__init__.py": "def f(a, b, *, c):\n    pass\n"}
    found = calls(tmp_path, lib, "import lib\nkw = {}\nlib.f(1, **kw)\nlib.f(1, 2, **kw, d=1)\n")
    assert [f.status for f in found] == ["unknown", "error"]
    assert "unexpected keyword 'd'" in found[1].detail


def test_what_cannot_be_resolved_is_unknown_never_ok(tmp_path: Path) -> None:
    lib = {"lib/__init__.py": """
        import functools

        def _wrap(fn):
            @functools.wraps(fn)
            def inner(*args, **kwargs):
                return fn(*args, **kwargs)
            return inner

        made = _wrap(print)

        @_wrap
        def wrapped(a):
            pass
    """}
    found = calls(tmp_path, lib, "import lib\nlib.made(1)\nlib.wrapped(1, 2)\nlib.gone()\n")
    assert [f.status for f in found] == ["unknown", "unknown", "error"]
    assert "assigned at run time" in found[0].detail
    assert "decorated with @_wrap" in found[1].detail
    assert "has no name 'gone'" in found[2].detail


def test_classmethods_bind_without_cls_and_docstring_decorators_are_transparent(tmp_path: Path) -> None:
    lib = {"lib/__init__.py": """
        def add_doc(text):
            def decorate(fn):
                fn.__doc__ = text
                return fn
            return decorate

        class Config:
            @classmethod
            @add_doc("load")
            def from_pretrained(cls, path, *, trust_remote_code=False):
                pass
    """}
    found = calls(tmp_path, lib, "from lib import Config\nConfig.from_pretrained('p')\nConfig.from_pretrained()\n")
    assert [f.status for f in found] == ["ok", "error"]
    assert "missing required parameter 'path'" in found[1].detail


def test_only_lines_and_packages_narrow_what_is_checked(tmp_path: Path) -> None:
    lib = {"lib/__init__.py": "def f(a):\n    pass\n", "other/__init__.py": "def g():\n    pass\n"}
    caller = "import lib, other\nlib.f()\nother.g(1)\n"
    assert [f.line for f in calls(tmp_path, lib, caller)] == [2, 3]
    assert [f.line for f in calls(tmp_path, lib, caller, only_lines={3})] == [3]
    assert [f.line for f in calls(tmp_path, lib, caller, packages={"lib"})] == [2]


def test_calls_inside_functions_use_local_imports_and_skip_local_values(tmp_path: Path) -> None:
    lib = {"lib/__init__.py": "def f(a):\n    pass\n"}
    caller = """
        def run(f):
            f()
            from lib import f as lib_f
            lib_f(1, 2)
    """
    found = only(calls(tmp_path, lib, caller))
    assert (found.line, found.status) == (5, "error")


def test_imports_resolve_names_and_modules_and_honour_guards(tmp_path: Path) -> None:
    write_tree(tmp_path, {
        "lib/__init__.py": "from .sub import present\n",
        "lib/sub.py": "present = 1\n",
        "app/__init__.py": "",
        "app/main.py": """
            from typing import TYPE_CHECKING
            from lib import present, absent
            import lib.sub
            import lib.nothing
            try:
                from lib import optional
            except ImportError:
                optional = None
            if TYPE_CHECKING:
                from lib import typing_only
        """,
    })
    found = check_imports(tmp_path / "app/main.py", ModuleIndex([str(tmp_path)]))
    by_callee = {f.callee: f for f in found}
    assert by_callee["lib.present"].status == "ok"
    assert (by_callee["lib.absent"].status, by_callee["lib.absent"].line) == ("error", 3)
    assert by_callee["lib.sub"].status == "ok"
    assert by_callee["lib.nothing"].status == "error"
    assert by_callee["lib.optional"].status == "ok" and "guarded" in by_callee["lib.optional"].detail
    assert "lib.typing_only" not in by_callee


def test_module_files_are_found_without_running_any_package_code(tmp_path: Path) -> None:
    write_tree(tmp_path, {
        "boom/__init__.py": "raise SystemExit('imported!')\n",
        "boom/inner.py": "",
        "nspkg/part/mod.py": "",
        "single.py": "",
    })
    index = ModuleIndex([str(tmp_path)])
    assert index.module_file("boom.inner") == tmp_path / "boom/inner.py"
    assert index.module_file("nspkg") == tmp_path / "nspkg"
    assert index.module_file("nspkg.part.mod") == tmp_path / "nspkg/part/mod.py"
    assert index.module_file("single") == tmp_path / "single.py"
    assert index.module_file("boom.missing") is None
    assert index.module_file("absent.thing") is None


def test_finding_to_dict_is_plain_json_data(tmp_path: Path) -> None:
    lib = {"lib/__init__.py": "def f(a):\n    pass\n"}
    document = only(calls(tmp_path, lib, "import lib\nlib.f(\n    1,\n    2)\n")).to_dict()
    assert document == {**document, "kind": "call", "status": "error", "line": 2, "code": "lib.f( 1, 2)",
                        "callee": "lib.f"}


@pytest.mark.parametrize("decorator", ["dataclass", "dataclass(kw_only=True)"])
def test_keyword_only_dataclasses_refuse_positionals(tmp_path: Path, decorator: str) -> None:
    lib = {"lib/__init__.py": f"from dataclasses import dataclass\n@{decorator}\nclass C:\n    a: int = 0\n"}
    found = only(calls(tmp_path, lib, "import lib\nlib.C(1)\n"))
    assert found.status == ("ok" if decorator == "dataclass" else "error")
