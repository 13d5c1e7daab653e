"""Validate extracted hidden states: whole files, right contents, and fidelity to the target.

Checks, each reported as {"ok": bool, "detail": ...}:
- files: every hs_i of the extracted rows opens, has the right keys, shapes and dtype, finite
  values, and token ids equal to prepared row i.
- fidelity: on a few samples the final captured slice (id n, the residual stream before the final
  norm) goes through the target's final norm and LM head in fp32, read alone from the safetensors
  shards (specops.pipeline.validation.fidelity); its next-token argmax must agree with the target's
  own choice at (nearly) every decidable position: a fresh hf forward ("hf") or the run's vLLM
  server's prompt_logprobs ("vllm"; "auto" picks it when that server is up). A position is decidable
  when its top-1 logit beats every other by more than the stored dtype's rounding can move them
  (fidelity.decidable_choices): in bf16 a near-tie may go either way between two correct forwards,
  so it proves nothing. A file whose rows are shifted, shuffled or from another layer agrees only by
  chance; too few decidable positions, or what cannot be checked, is status "unknown", never ok.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from specops import atomic
from specops.errors import BadInput, CheckFailed
from specops.pipeline import vllm
from specops.pipeline.extraction import file_for, verify_header
from specops.pipeline.run import Manifest, Run, StepContext, StepReport, config_hash

FIDELITY_THRESHOLD = 0.98  # of the decidable positions; misaligned states agree at 10-40 %
MIN_DECIDABLE = 32  # fewer decidable positions than this prove nothing either way
MAX_LISTED = 20


def fidelity_indices(count: int, wanted: int) -> list[int]:
    """`wanted` rows spread evenly over 0..count-1, always including the first."""
    wanted = min(wanted, count)
    return sorted({round(i * (count - 1) / max(wanted - 1, 1)) for i in range(wanted)})


def check_files(run: Run, dataset: Any, count: int, layer_ids: list[int], hidden: int,
                dtype: str) -> tuple[dict, set[int]]:
    """(the files check as reported, the full set of bad rows): the report lists at most MAX_LISTED
    problems for people; the fidelity check needs every bad row."""
    import torch
    from safetensors.torch import load_file

    bad: dict[int, str] = {}
    for index in range(count):
        expected = list(dataset[index]["input_ids"])
        path = file_for(run.paths.hidden_states, index)
        problem = verify_header(path, len(expected), len(layer_ids), hidden, dtype)
        if problem is None:
            tensors = load_file(str(path))
            if tensors["token_ids"].tolist() != expected:
                problem = "token ids differ from the prepared sample"
            elif not bool(torch.isfinite(tensors["hidden_states"]).all()):
                problem = "hidden states hold non-finite values"
        if problem is not None:
            bad[index] = problem
    listed = [{"file": f"hs_{i}.safetensors", "problem": why} for i, why in list(bad.items())[:MAX_LISTED]]
    return {"ok": not bad, "detail": {"checked": count, "bad": len(bad), "problems": listed}}, set(bad)


REFERENCES = ("auto", "hf", "vllm")


def unknown(reference: str, reason: str, samples: list | None = None) -> dict:
    """Fidelity that could not be checked: never ok, with the reason."""
    return {"ok": False, "detail": {"status": "unknown", "reason": reason, "agreement": None,
                                    "threshold": FIDELITY_THRESHOLD, "samples": samples or [],
                                    "reference": reference}}


def check_fidelity(run: Run, indices: list[int], files_ok: dict[int, bool], reference: str = "auto",
                   endpoint: str | None = None) -> dict:
    """Fidelity of rows `indices`: captured final layer -> norm + head (loaded alone) vs the reference.

    reference  "hf" (a fresh forward of the whole target), "vllm" (prompt_logprobs of this run's
               vLLM server, or of `endpoint` when given) or "auto" (vllm when such a server is up,
               else hf). What cannot be checked is reported as status "unknown", never ok.
    """
    from safetensors.torch import load_file

    from specops.pipeline.target import choose_device, load_target
    from specops.pipeline.validation import fidelity

    if reference not in REFERENCES:
        return unknown(reference, f"reference {reference!r} is not one of {', '.join(REFERENCES)}")
    chosen, how, staging = reference, None, None
    if reference in ("auto", "vllm") and endpoint is None:
        endpoint, staging, how = vllm.find_endpoint(run)
        if endpoint is None and reference == "vllm":
            return unknown("vllm", f"no vLLM server to ask: {how}")
    if reference == "auto":
        chosen = "vllm" if endpoint else "hf"
    device, dtype = choose_device(run.config.dtype)
    try:
        projector = fidelity.load_projector(run.model_path, device)
        if chosen == "vllm":
            source = fidelity.VllmReference(endpoint, staging=staging or vllm.staging_dir(run))
        else:
            source = fidelity.HfReference(load_target(run, device, dtype))
    except fidelity.Unsupported as exc:
        return unknown(chosen, str(exc))
    per_sample, total = [], fidelity.Agreement()
    for index in indices:
        if not files_ok.get(index, True):
            per_sample.append({"index": index, "skipped": "file failed the file checks"})
            continue
        tensors = load_file(str(file_for(run.paths.hidden_states, index)))
        try:
            row = fidelity.agreement(projector, source, tensors["token_ids"], tensors["hidden_states"])
        except fidelity.Unsupported as exc:
            return unknown(chosen, f"row {index}: {exc}", per_sample)
        total = total.add(row)
        per_sample.append({"index": index, "positions": row.positions, "decidable": row.decidable,
                           "agreement": round(row.decided_agreed / row.decidable, 4) if row.decidable else None})
    if total.positions == 0:
        return unknown(chosen, "no positions to compare (every chosen row failed the file checks or is empty)",
                       per_sample)
    rule = decision_rule(total)
    if total.decidable < MIN_DECIDABLE:
        report = unknown(chosen, f"only {total.decidable} of {total.positions} positions are decidable in "
                         f"{rule['dtype']} (at least {MIN_DECIDABLE} needed): check more rows "
                         "(--fidelity-samples)", per_sample)
        report["detail"]["rule"] = rule
        return report
    rate = total.decided_agreed / total.decidable
    detail = {"status": "ok" if rate >= FIDELITY_THRESHOLD else "failed", "agreement": round(rate, 4),
              "threshold": FIDELITY_THRESHOLD, "positions": total.positions, "decidable": total.decidable,
              "agreement_all_positions": round(total.agreed / total.positions, 4), "rule": rule,
              "samples": per_sample, "reference": chosen, "projection": projector.source}
    if chosen == "vllm":
        detail["endpoint"] = endpoint
        if how:
            detail["server"] = how
    return {"ok": rate >= FIDELITY_THRESHOLD, "detail": detail}


def decision_rule(total: Any) -> dict[str, Any]:
    """What the check decided with: the stored dtype's unit roundoff, the roundings allowed, and the
    margin over the nearest rival that positions had to exceed (median and largest)."""
    import statistics

    from specops.pipeline.validation import fidelity

    tolerances = total.tolerances or [0.0]
    return {"decidable_when": "top-1 logit - rounding bound > every other logit + its bound",
            "dtype": total.dtype, "unit_roundoff": total.unit_roundoff, "roundings": fidelity.ROUNDINGS,
            "tolerance_median": round(statistics.median(tolerances), 6), "tolerance_max": round(max(tolerances), 6),
            "min_decidable": MIN_DECIDABLE}


def validate(run: Run, fidelity_samples: int, reference: str = "auto",
             endpoint: str | None = None, skip_unchanged: bool = False) -> dict[str, Any]:
    """Check the run's hidden-state files. With skip_unchanged (a pipeline's re-run), files that
    passed before with the same inputs are not checked again; `step validate` always checks."""
    import datasets

    from specops.pipeline.target import hidden_size

    manifest = Manifest(run.paths.run_dir)
    extract_record = manifest.record("extract")
    if not extract_record or extract_record.get("status") != "done":
        raise BadInput(f"{run.label}: nothing extracted yet for run {run.paths.name}: run `step extract` first")
    prepared_rows = (manifest.record("prepare") or {}).get("counts", {}).get("rows")
    # the run's N rows: an earlier, larger extraction may have left more files than are prepared now
    count = min(int(extract_record["counts"]["samples"]), prepared_rows or int(extract_record["counts"]["samples"]))
    inputs = {"extract": extract_record["inputs_hash"], "samples": count, "fidelity_samples": fidelity_samples}
    if skip_unchanged and manifest.is_current("validate", config_hash(inputs)) and run.paths.validate_report.is_file():
        previous = json.loads(run.paths.validate_report.read_text())
        if previous.get("ok"):
            return {**previous, "status": "skipped: unchanged"}
    layer_ids = extract_record["inputs"]["layer_ids"]
    dtype = extract_record["inputs"]["dtype"]
    dataset = datasets.load_from_disk(str(run.paths.prepared)).with_format(None)

    print(f"validate: checking {count} hidden-state files", file=sys.stderr)
    checks: dict[str, dict] = {}
    checks["files"], bad = check_files(run, dataset, count, layer_ids, hidden_size(run), dtype)
    indices = fidelity_indices(count, fidelity_samples)
    print(f"validate: fidelity on rows {indices}", file=sys.stderr)
    checks["fidelity"] = check_fidelity(run, indices, {i: i not in bad for i in indices}, reference, endpoint)
    ok = all(check["ok"] for check in checks.values())

    with manifest.recorded("validate", config_hash(inputs), inputs) as outcome:
        outcome.counts, outcome.status = {"files": count, "fidelity_rows": len(indices)}, "done" if ok else "failed"
    document = {"ok": ok, "step": "validate", "checks": checks}
    atomic.write_json(run.paths.validate_report, document)
    return document


def pipeline_step(context: StepContext) -> StepReport:
    """The pipeline's validate: files that passed with the same inputs are not checked again; a
    failing check stops the pipeline."""
    report = validate(context.run, 4, skip_unchanged=True)
    if not report["ok"]:
        raise CheckFailed("validation failed: " + "; ".join(
            f"{name}: {check.get('detail')}" for name, check in report["checks"].items() if not check["ok"]))
    agreement = report["checks"].get("fidelity", {}).get("detail", {}).get("agreement")
    return {**report, "figures": {"fidelity": agreement}}
