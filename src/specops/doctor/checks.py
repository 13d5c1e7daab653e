"""The doctor: every check in one pass, as a JSON-ready document. `specops.doctor.diagnose` is its face."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from specops.analysis import ModuleIndex
from specops.doctor import _entry_point, _import_probe
from specops.doctor._aux_layers import aux_items
from specops.doctor._build import build_items
from specops.doctor._cached import cached_items, start_probe
from specops.doctor._capabilities import check_capabilities, server_pipeline
from specops.doctor._connector import connector_items
from specops.doctor._contract import (
    CALLER,
    CALLERS,
    check_api_contract,
    check_connector_contract,
    check_pipeline_contract,
)
from specops.doctor._engine_loop import check_engine_loops
from specops.doctor._flags import check_flags
from specops.doctor._http import http_items
from specops.doctor._instances import check_instances
from specops.doctor._kinds import kind_items, read_kind
from specops.doctor._model import check_model
from specops.doctor._model_rules import command_flag_items, model_rule_items
from specops.doctor._parallel import check_parallel
from specops.doctor._processor import processor_items, served_processor_items
from specops.doctor._quantization import target_items as quantization_items
from specops.doctor._report import Item
from specops.doctor._resources import gpus, same_filesystem, storage, tmux, writable
from specops.doctor._serve_env import is_cpu_build, serve_view, vllm_version
from specops.doctor._serving import DRAFT_MODEL_TYPE, attention_items, check_serving
from specops.doctor._target import check_target
from specops.doctor._training_free import training_free_items
from specops.doctor.settings import RunSettings
from specops.host.gpus import device_count
from specops.host.installed import distributions, normalise
from specops.host.paths import workdir

CHECKS = ("api", "import", "flags", "capability", "serving", "model", "resources", "entry_point", "draft")


def without_own_code(search_path: list[str]) -> list[str]:
    """The search path as the run's Python sees it: without the folders that are only there because
    specops runs — a specops package folder (first on the path when the agent runs as a script), a
    bundle folder holding nothing but specops, and the host's workdir (first on the path when the agent
    runs as the control side starts it: `python -m specops` from the workdir). Nothing the doctor judges
    lives there, and without them every workdir of one host reads the same path: the cached analysis
    and import probe are shared by all of them, and stay valid while a run writes into its workdir."""
    own_workdir = workdir()
    kept = []
    for entry in search_path:
        folder = Path(entry or ".")
        if folder.name == "specops" and (folder / "contract" / "protocol.py").is_file() \
                and (folder / "__main__.py").is_file():
            continue
        try:
            names = set(os.listdir(folder)) - {"__pycache__"}
        except OSError:
            names = set()
        if names == {"specops"} or _same_folder(folder, own_workdir):
            continue
        kept.append(entry)
    return kept


def _same_folder(folder: Path, other: Path) -> bool:
    try:
        return folder.resolve() == other
    except OSError:
        return False


def run_doctor(settings: RunSettings, search_path: list[str] | None = None,
               checks: tuple[str, ...] = CHECKS, pending: Callable | None = None,
               sets_of: Callable | None = None) -> dict:
    """{"ok", "findings", "timing_s", "versions"}: ok is False when any finding is an error. `pending` overlays
    the fitting sets not applied yet (judge as patched); `sets_of` only finds them (the serve env's findings)."""
    started = time.perf_counter()
    path = without_own_code(search_path if search_path is not None else sys.path)
    index = ModuleIndex(path)
    # the run's first step applies the patch sets that fit: judge the code as they will leave it
    overlaid = pending(index, path) if pending is not None else []
    installed = distributions(path)
    versions = {name: (installed[normalise(name)].version if normalise(name) in installed else None)
                for name in ("vllm", "speculators", "transformers", "torch")}
    # vLLM is judged where it serves: the serve env (inventory envs.serve) read before the run's own packages
    serve_path = serve_view(settings.serve_python, path)
    serving = ModuleIndex(without_own_code(serve_path)) if serve_path else index
    # the serve env's own fitting sets not applied yet: overlaid on what its checks read when judged as patched
    serve_sets = _entry_point.serve_sets(settings.serve_python, path, serving, pending, sets_of) if serve_path else []
    versions["vllm"] = vllm_version(serve_path or path)
    platform = "cpu" if is_cpu_build(serve_path or path) or (
        settings.gpus == 0 if settings.gpus is not None else device_count() == 0) else "gpu"
    timings: dict[str, float] = {}
    items: list[Item] = []

    def timed(name: str, produce) -> None:
        if name not in checks:
            return
        began = time.perf_counter()
        items.extend(produce())
        timings[name] = round(time.perf_counter() - began, 3)

    server = server_pipeline(versions)
    model_items, facts = check_model(settings, server, versions.get("speculators"))
    cache_hits: dict[str, bool] = {}
    # the import probe runs in a child while the static checks run here
    probe = start_probe(index, path, cache_hits) if "import" in checks else None
    # the serve env's `vllm serve --help` runs in a child too, as the launch would start it
    entry = _entry_point.start(settings.serve_python if serve_path else (
        sys.executable if vllm_version(path) else None), cache_hits) if "entry_point" in checks else None
    architecture = facts.get("architecture")
    # hs_connectors runs inside vLLM's server (its KV connectors): judged where that server runs, the serve env,
    # against the serve env's vLLM; in the run's env only when that env serves too
    callers = (CALLER,) if serve_path else CALLERS
    timed("api", lambda: cached_items("api", [versions, architecture, callers], index, lambda: (
        check_api_contract(index, versions, callers) + check_pipeline_contract(index, versions)
        + check_instances(index, versions, architecture) + check_engine_loops(index, versions)), cache_hits)
        + (cached_items("api-serve", [versions], serving, lambda: check_connector_contract(serving, versions),
                        cache_hits) if serve_path else []))
    timed("flags", lambda: check_flags(serving, {"serve_flags": settings.serve_flags}, versions) + check_flags(index, {
        "prepare_flags": settings.prepare_flags, "generate_flags": settings.generate_flags,
        "train_flags": settings.train_flags}, versions))
    if settings.backend != "hf":
        timed("capability", lambda: check_capabilities(serving, versions, facts.get("architecture"),
                                                       settings.serve_flags, settings.prepare_flags,
                                                       required=settings.backend == "vllm"))
        timed("serving", lambda: check_serving(serving, versions, facts.get("architecture"), DRAFT_MODEL_TYPE)
              + attention_items(serving, settings, versions["vllm"], platform)
              + aux_items(serving, versions["vllm"], facts.get("layer_ids"), facts.get("layers"))
              + connector_items(serving, settings.hidden_states_backend, versions["vllm"])
              + training_free_items(serving)  # what `evaluate --compare` serves without training
              + build_items(serve_path or path)  # the serve env's vLLM against the torch and CUDA beside it
              + cached_items("http", [versions], serving, lambda: http_items(serving, versions), cache_hits))
    # the target's side: vLLM read where it serves (the serve env), its CPU backends on the cpu platform
    timed("model", lambda: model_items + check_parallel(settings)
          + check_target(index, settings, settings.backend == "vllm" and platform == "cpu", serving=serving)
          + quantization_items(settings, index, serving if versions["vllm"] else None, platform)
          + command_flag_items(index, facts, settings)
          + processor_items(index, settings.model_path, facts.get("outer_model_type"), versions.get("speculators"))
          + served_processor_items(serving, settings.model_path, architecture, settings.backend)
          + cached_items("model", [versions, architecture, facts.get("remote_tokenizer"), facts.get("remote_config"),
                                   facts.get("outer_model_type"), settings.trust_remote_code, settings.backend], index,
                         lambda: model_rule_items(index, versions, facts, settings), cache_hits))
    # the run's kind of draft: trained by this env's speculators, served by the serve env's vLLM (its loader)
    timed("draft", lambda: kind_items(read_kind(settings.draft_method or "eagle3", index,
                                                serving if versions["vllm"] else None, versions,
                                                cpu_host=platform == "cpu")))
    if probe is not None:
        timed("import", lambda: _import_probe.items(probe[0], versions, probe[1]))
    layer_ids = facts.get("layer_ids")

    def resources() -> list[Item]:
        found = [gpus(), storage(settings, len(layer_ids) if layer_ids else None, facts.get("hidden"),
                                 bool(settings.gpus) if settings.gpus is not None else device_count() > 0)]
        found.append(same_filesystem(settings.staging_dir, settings.output_dir) or Item(
            "resources", "unknown", "staging_dir", "staging_dir or output_dir not set",
            "set both (on one filesystem, so finished files move into place atomically)"))
        advice = [Item("resources", "warn", "run settings", line, "see the line: the figure and the setting to "
                       "use instead") for line in settings.advice]  # known to waste a training: said before it
        return [*found, tmux(), writable(workdir()), *advice]

    timed("resources", resources)
    if entry is not None:
        timed("entry_point", lambda: _entry_point.entry_items(entry, serve_sets, as_patched=pending is not None))
        timings["entry_point"] = entry.seconds  # its own time: the run (cold) or the cache's look (warm)
    items.extend(_entry_point.serve_set_items(settings.serve_python, serve_sets, as_patched=pending is not None))
    items.extend(Item("patches", "ok", entry["set"], f"judged as patch set {entry['set']} will leave it "
                      f"({', '.join(entry['patches'])}: not applied yet; the pipeline's patches step applies it)")
                 for entry in overlaid)
    return {
        "ok": not any(item.result == "error" for item in items),
        "findings": [item.to_dict() for item in items],
        "versions": versions,
        "serve_env": settings.serve_python if serve_path else None,
        "timing_s": {**timings, "total": round(time.perf_counter() - started, 3)},
        "cache": cache_hits,
    }

