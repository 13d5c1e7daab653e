"""The doctor: what a model load would find, found from the installed sources in seconds.

A leaf: it reads installed packages (standard library only) and a `RunSettings` value; it never
imports the pipeline. Without a run it judges the installed stack (API contracts, capabilities);
with one it adds the run's checks (flags, model config, resources).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from specops.contract.errors import BadInput
from specops.doctor._attention import CPUINFO_ENV, AttentionReading, host_has_amx, read_attention
from specops.doctor._aux_layers import AuxRule, aux_rule
from specops.doctor._build import BuildReading, read_build
from specops.doctor._capture import Capture, aux_capture
from specops.doctor._contract import PIPELINE
from specops.doctor._cpu_rotary import native_rotary_args
from specops.doctor._kinds import KindReading, read_kind
from specops.doctor._quantization import Quantization, read_quantization
from specops.doctor._quantization import refusal as quantization_refusal
from specops.doctor._report import Item
from specops.doctor._serve_env import (
    SERVE_PYTHON_ENV,
    chosen_serve_python,
    interpreter_path,
    is_cpu_build,
    vllm_path,
    vllm_version,
)
from specops.doctor._serving import EVALUATE_ANYWAY
from specops.doctor._training_free import Support, training_free_support
from specops.doctor.checks import CHECKS, run_doctor
from specops.doctor.settings import RunSettings, parse_run_json

RUN_CHECKS = ("flags", "model", "resources", "draft")  # about a run's settings: meaningless without one
STACK_CHECKS = tuple(name for name in CHECKS if name not in RUN_CHECKS)

__all__ = [
    "CHECKS",
    "CPUINFO_ENV",
    "EVALUATE_ANYWAY",
    "PIPELINE",
    "RUN_CHECKS",
    "SERVE_PYTHON_ENV",
    "STACK_CHECKS",
    "AttentionReading",
    "AuxRule",
    "BuildReading",
    "Capture",
    "Item",
    "KindReading",
    "Quantization",
    "RunSettings",
    "Support",
    "aux_capture",
    "aux_rule",
    "chosen_serve_python",
    "diagnose",
    "draft_attention",
    "draft_kind",
    "eagle3_support",
    "host_has_amx",
    "interpreter_path",
    "is_cpu_build",
    "native_rotary_args",
    "parse_run_json",
    "quantization_refusal",
    "read_attention",
    "read_build",
    "read_quantization",
    "site_path",
    "target_quantization",
    "training_free_support",
    "vllm_path",
    "vllm_version",
]


def diagnose(search_path: list[str] | None = None, run: RunSettings | None = None,
             checks: Iterable[str] | None = None, pending: Callable | None = None,
             sets_of: Callable | None = None) -> dict:
    """The doctor's document: {"ok", "scope", "findings", "versions", "timing_s"}; ok is False when any
    finding is an error.

    search_path  where the installed packages are looked up (default: this interpreter's sys.path)
    run          the run to judge; None judges the installed stack alone (scope "stack")
    checks       a subset of CHECKS (default: every check that applies to the scope)
    pending      (index, search path) -> patch sets overlaid: judge the code as the run's patches step
                 will leave it (specops.patching.pending.overlay_fitting_sets, handed in by specops.cli)
    sets_of      the same callable, to find (not judge as applied) the serve env's sets not applied yet
    """
    wanted = tuple(checks) if checks is not None else (CHECKS if run is not None else STACK_CHECKS)
    for name in wanted:
        if name not in CHECKS:
            raise BadInput(f"--checks: unknown check {name!r}; choose from {', '.join(CHECKS)}")
        if run is None and name in RUN_CHECKS:
            raise BadInput(f"--checks: {name} checks a run's settings; give --run NAME or --run-json")
    document = run_doctor(run or RunSettings(backend=None), search_path, wanted, pending=pending, sets_of=sets_of)
    return {"ok": document["ok"], "scope": "run" if run is not None else "stack",
            **{key: value for key, value in document.items() if key != "ok"}}


def site_path(sites: list[str] | None) -> list[str]:
    """--site folders first, then this interpreter's path: what the run's Python would see."""
    return [str(Path(site).resolve()) for site in sites or []] + sys.path


def eagle3_support(search_path: list[str], architecture: str) -> tuple[bool | None, str]:
    """Whether the vLLM on `search_path` serves an EAGLE-3 draft for `architecture` (its registry's class
    implements SupportsEagle3), and the class it found; None when that cannot be told from the source."""
    from specops.analysis import ModuleIndex
    from specops.doctor._capabilities import architecture_class, implements

    index = ModuleIndex(search_path)
    mapped = architecture_class(index, architecture)
    if mapped is None:
        return False, f"vLLM's model registry has no {architecture}"
    return implements(index, f"vllm.model_executor.models.{mapped[0]}.{mapped[1]}", "SupportsEagle3"), mapped[1]


def draft_kind(kind: str, train_path: list[str], serve_path: list[str] | None, tokens: int = 1,
               cpu_host: bool = False) -> KindReading:
    """Whether the speculators on `train_path` trains `kind` drafts and the vLLM on `serve_path` (None: none here)
    serves them (`cpu_host`: on vLLM's CPU backend), and the speculative config its loader gives them; read from
    their files (doctor/_kinds.py)."""
    from specops.analysis import ModuleIndex
    from specops.host.installed import distributions, normalise

    installed = distributions(train_path)
    versions = {"speculators": installed[normalise("speculators")].version
                if normalise("speculators") in installed else None,
                "vllm": vllm_version(serve_path) if serve_path else None}
    return read_kind(kind, ModuleIndex(train_path), ModuleIndex(serve_path) if serve_path else None, versions,
                     tokens, cpu_host)


def draft_attention(search_path: list[str], text: dict, gpus: int, draft_head_size: int | None = None,
                    serve_args: list[str] | tuple[str, ...] = ()) -> AttentionReading:
    """Whether the vLLM on `search_path` can serve an EAGLE-3 draft beside the target whose language model's
    config is `text`, on this host (a CPU build, or no GPUs: vLLM's CPU backends), for the run's serve args (an
    `--attention-backend` they select), read from its files."""
    from specops.analysis import ModuleIndex

    platform = "cpu" if is_cpu_build(search_path) or gpus == 0 else "gpu"
    return read_attention(ModuleIndex(search_path), text, platform, draft_head_size=draft_head_size,
                          serve_args=serve_args)


def target_quantization(settings: RunSettings, search_path: list[str], serve_path: list[str] | None,
                        loads_hf: bool) -> list[Item]:
    """The doctor's items on the target's quantization_config for the envs that load it: the run's env on
    `search_path` (transformers; its breaks are errors where `loads_hf`), and vLLM on `serve_path` when
    `settings.backend` is vllm. Read from the installed files (doctor/_quantization.py)."""
    from specops.analysis import ModuleIndex
    from specops.doctor._quantization import target_items
    from specops.host.gpus import device_count

    gpus = settings.gpus if settings.gpus is not None else device_count()
    platform = "cpu" if (serve_path is not None and is_cpu_build(serve_path)) or gpus == 0 else "gpu"
    return target_items(settings, ModuleIndex(search_path), ModuleIndex(serve_path) if serve_path else None,
                        platform, loads_hf=loads_hf)
