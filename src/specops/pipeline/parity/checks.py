"""Train-vs-serve parity: what training used against what the installed vLLM will use, key by key.

Each row names a key, the training side's value, the serving side's value and where the serving value was
read. A row whose two values differ is a mismatch: the draft would load and serve, and almost never be
accepted (auxiliary layers that differ: vLLM #50170; a layer off by one: speculators #705).

Layer numbering: vLLM's auxiliary id i < n is the hidden state ENTERING decoder layer i (id 0: the
embedding output). specops' extraction backends capture in that numbering (hf: pre-hooks on layer i;
vllm: the server's own capture), recorded in the manifest's extract inputs; a capture AFTER layer i
(speculators 0.3's in-process worker) is vLLM id i + 1 (CAPTURE_OFFSET).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specops.pipeline.parity.vllm_reading import VllmReading

# Extraction backend -> what to add to its capture index to get vLLM's auxiliary layer id.
CAPTURE_OFFSET = {"hf": 0, "vllm": 0, "speculators-0.3": 1}
# Keys with a row of their own (or vLLM's bookkeeping), left out of the flags comparison.
OWN_ROWS = {"eagle_aux_hidden_state_layer_ids", "draft_vocab_size", "architectures", "vocab_size"}


@dataclass(frozen=True)
class Trained:
    """What training used."""

    aux_layers: list[int]  # the auxiliary layers extraction captured, in file order, in vLLM's numbering
    aux_origin: str  # where those came from
    target_layers: int
    target_vocab: int | None
    draft_vocab: int | None  # the d2t file training was given (entries), None without one
    architecture: str | None  # the target's architectures[0]
    speculator_type: str = "eagle3"  # what specops trains
    extracted_by: str | None = None  # the extraction backend that captured the files (the manifest), None: none yet
    final_layer: bool = False  # training reads the final layer's output (id n) from the files


def capture_rows(trained: Trained, capture: Any, where_vllm: str) -> list[dict[str, Any]]:
    """vLLM's own numbering of the states its target model captures (doctor.aux_capture, read from the model's
    forward) against the numbering training's files used: id i entering layer i; and, where vLLM extracted the
    files, the final layer's output (id n: DeepseekV2Model captures it only from vLLM 0.25, vLLM #48124)."""
    rows: list[dict[str, Any]] = []
    where = f"{where_vllm}: {capture.model_class or trained.architecture}.forward ({capture.where})"
    numbering = {True: "id i entering layer i", False: "id i the output of layer i", None: "not read"}
    _row(rows, "auxiliary layer numbering", numbering[True], numbering[capture.entering], where)
    if capture.entering is None:
        rows[-1].update(ok=True, unknown=True)  # unknown is said, not refused
    if trained.final_layer and trained.extracted_by == "vllm":
        _row(rows, "final layer captured", f"id {trained.target_layers}",
             {True: f"id {trained.target_layers}", False: "never (vLLM #48124, fixed in 0.25)", None: "not read"}[
                 capture.final], where)
        if capture.final is None:
            rows[-1].update(ok=True, unknown=True)
    return rows


def vllm_numbering(capture_ids: list[int], backend: str) -> list[int]:
    return [layer + CAPTURE_OFFSET.get(backend, 0) for layer in capture_ids]


def _row(rows: list[dict[str, Any]], key: str, training: Any, serving: Any, where: str) -> None:
    rows.append({"key": key, "training": training, "serving": serving, "ok": training == serving, "where": where})


def compare(config: dict[str, Any], shapes: dict[str, list[int]], trained: Trained, reading: VllmReading | None,
            served_method: str | None, speculators_defaults: dict[str, Any],
            eagle3_support: tuple[bool | None, str] | None) -> list[dict[str, Any]]:
    """Every parity row for one draft (config.json as written, its tensor shapes) and how it will be served."""
    rows: list[dict[str, Any]] = []
    where_vllm = f"vLLM {reading.version}" if reading else "no vLLM here: the config as vLLM's loader reads it"
    kind = config.get("speculators_model_type")
    _row(rows, "speculators_model_type", trained.speculator_type, kind, "the draft's config.json")
    vllm_method = reading.method(config) if reading else kind
    _row(rows, "method", vllm_method, served_method or f"none: specops serves no {kind} drafts",
         f"{where_vllm} ({reading.where.get('method', '?')}) vs the --speculative-config specops serves with"
         if reading else "the --speculative-config specops serves with")
    hf: dict[str, Any] = dict(config.get("transformer_layer_config") or {})
    if reading is not None:
        try:
            hf = reading.draft_hf_config(config)
        except (ValueError, KeyError, TypeError) as exc:
            _row(rows, "transformer_layer_config.model_type", hf.get("model_type"), f"refused: {exc}",
                 f"{where_vllm} ({reading.where.get('loader', '?')})")
            return rows
    else:
        hf.update({key: config.get(key) for key in ("draft_vocab_size", "eagle_aux_hidden_state_layer_ids")})
    if reading is not None:
        served_aux, origin = reading.aux_layers(hf, trained.target_layers)
        where = f"{where_vllm}: {origin} ({reading.where.get('aux layers', '?')})"
    else:
        served_aux, where = list(config.get("eagle_aux_hidden_state_layer_ids") or []), where_vllm
    _row(rows, "eagle_aux_hidden_state_layer_ids", trained.aux_layers, served_aux,
         f"training: {trained.aux_origin}; serving: {where}")
    if reading is not None and reading.aux_count is not None and trained.speculator_type in ("eagle3", "peagle"):
        _row(rows, "auxiliary layer count", len(trained.aux_layers), reading.aux_count,
             f"training: {trained.aux_origin}; serving: {where_vllm}'s EAGLE-3 draft sizes its fc for exactly "
             f"{reading.aux_count} ({reading.where.get('aux count', '?')}; vLLM #54526)")
    d2t = (shapes.get("d2t") or [None])[0]
    t2d = (shapes.get("t2d") or [None])[0]
    training_draft_vocab = trained.draft_vocab if trained.draft_vocab is not None else d2t
    if training_draft_vocab is None and trained.speculator_type != "eagle3":
        training_draft_vocab = trained.target_vocab  # no mapping given (dflash2, mtp): the target's whole vocabulary
    _row(rows, "draft_vocab_size", training_draft_vocab, hf.get("draft_vocab_size"),
         f"training: the d2t file; serving: {where_vllm}")
    if d2t is not None:
        _row(rows, "d2t entries", training_draft_vocab, d2t,
             "the draft's model.safetensors (vLLM maps drafted ids with it)")
    if trained.target_vocab is not None:
        _row(rows, "vocab_size", trained.target_vocab, hf.get("vocab_size"),
             f"the target's config.json vs the draft's transformer_layer_config ({where_vllm})")
        if t2d is not None:
            _row(rows, "t2d entries", trained.target_vocab, t2d, "the target's vocabulary vs the draft's t2d")
    for key in sorted(hf):  # the flags vLLM's loader sets (norm_before_residual, norm_before_fc, ...)
        if key in OWN_ROWS or key in (config.get("transformer_layer_config") or {}):
            continue
        if trained.speculator_type != "eagle3" and key not in config and key not in speculators_defaults:
            continue  # what vLLM derives for the other kinds (dflash_config, target_layer_ids, pard_token, ...)
        training = config[key] if key in config else speculators_defaults.get(key)
        _row(rows, key, training, hf[key], f"training: {'config.json' if key in config else 'speculators default'};"
             f" serving: {where_vllm}")
    verifier = ((config.get("speculators_config") or {}).get("verifier") or {}).get("architectures") or []
    if trained.architecture is not None:
        if verifier:
            _row(rows, "verifier.architectures", trained.architecture, verifier[0],
                 "the target's config.json vs the verifier the draft was made for")
        if eagle3_support is not None:
            supports, found = eagle3_support
            _row(rows, "target architecture", f"{trained.architecture} (SupportsEagle3)",
                 f"{trained.architecture} ({found}: "
                 f"{ {True: 'SupportsEagle3', False: 'no SupportsEagle3', None: 'SupportsEagle3?'}[supports]})"
                 if supports is not True else f"{trained.architecture} (SupportsEagle3)",
                 f"{where_vllm}'s model registry")
            if supports is None:
                rows[-1]["ok"] = True  # unknown is said, not refused
                rows[-1]["unknown"] = True
    return rows


def mismatch_line(row: dict[str, Any]) -> str:
    return f"{row['key']}: training used {row['training']}, serving will use {row['serving']} ({row['where']})"
