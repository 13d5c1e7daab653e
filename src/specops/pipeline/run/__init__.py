"""The run room: a run's config (runs/<name>.yaml), its folders, its manifest, the fingerprints of step
inputs, and its effective settings on this host (run config + command line + host, resolved once: settings.py).
Every other room reads a run through this face."""

from specops.pipeline.run.config import (
    Run,
    RunConfig,
    RunPaths,
    check_run_name,
    config_hash,
    default_backend,
    derive_layer_ids,
    load_run_config,
    read_model_config,
    roles_problem,
    text_config,
)
from specops.pipeline.run.context import Hosts, OneHost, StepContext, shares_of
from specops.pipeline.run.fingerprint import file_digest, file_sha256, model_digest, tokenizer_digest
from specops.pipeline.run.gguf_target import SOURCE_FILE, gguf_digest, gguf_source, is_gguf, written_dtype
from specops.pipeline.run.manifest import GUARD, Manifest, Outcome, dependents, package_versions
from specops.pipeline.run.reports import (
    Acceptance,
    DraftCounts,
    EvaluateCounts,
    ExtractCounts,
    Figures,
    PrepareCounts,
    RegenerateCounts,
    StepRecord,
    StepReport,
    TrainCounts,
)
from specops.pipeline.run.sections import RegenerateSettings, StopIf
from specops.pipeline.run.settings import EffectiveSettings, baseline_server, regenerate_server, resolve
from specops.pipeline.run.sweeps import Setting, settings_of, sync_records

__all__ = [
    "GUARD",
    "SOURCE_FILE",
    "Acceptance",
    "DraftCounts",
    "EffectiveSettings",
    "EvaluateCounts",
    "ExtractCounts",
    "Figures",
    "Hosts",
    "Manifest",
    "OneHost",
    "Outcome",
    "PrepareCounts",
    "RegenerateCounts",
    "RegenerateSettings",
    "Run",
    "RunConfig",
    "RunPaths",
    "Setting",
    "StepContext",
    "StepRecord",
    "StepReport",
    "StopIf",
    "TrainCounts",
    "baseline_server",
    "check_run_name",
    "config_hash",
    "default_backend",
    "dependents",
    "derive_layer_ids",
    "file_digest",
    "file_sha256",
    "gguf_digest",
    "gguf_source",
    "is_gguf",
    "load_run_config",
    "model_digest",
    "package_versions",
    "read_model_config",
    "regenerate_server",
    "resolve",
    "roles_problem",
    "settings_of",
    "shares_of",
    "sync_records",
    "text_config",
    "tokenizer_digest",
    "written_dtype",
]
