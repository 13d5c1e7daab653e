"""Validate extracted hidden states: whole files, right contents, and fidelity to the target.

Checks, each reported as {"ok": bool, "detail": ...}:
- files: every hs_i of the extracted rows opens, has the right keys, shapes and dtype, finite
  values, and token ids equal to prepared row i.
- fidelity: on a few samples the final captured slice (id n, the residual stream before the final
  norm) goes through the target's final norm and LM head; its next-token argmax must agree with a
  fresh forward of the target at (nearly) every position. A file whose rows are shifted or
  shuffled agrees only by chance.
"""

from __future__ import annotations

import sys
from typing import Any

from specops import atomic
from specops.errors import BadInput
from specops.pipeline.config import Run
from specops.pipeline.hidden_states import file_for, verify_header

FIDELITY_THRESHOLD = 0.98  # bf16 rounding may flip a near-tie; misalignment drops far below
MAX_LISTED = 20


def fidelity_indices(count: int, wanted: int) -> list[int]:
    """`wanted` rows spread evenly over 0..count-1, always including the first."""
    wanted = min(wanted, count)
    return sorted({round(i * (count - 1) / max(wanted - 1, 1)) for i in range(wanted)})


def check_files(run: Run, dataset: Any, count: int, layer_ids: list[int], hidden: int, dtype: str) -> dict:
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
    return {"ok": not bad, "detail": {"checked": count, "bad": len(bad), "problems": listed}}


def agreement(model: Any, tokens: Any, hidden_states: Any) -> tuple[int, int]:
    """(positions whose argmax from the captured final layer matches the fresh forward, positions)."""
    import torch

    from specops.pipeline.extract_hf import decoder_parts

    _, _, norm = decoder_parts(model)
    head = model.get_output_embeddings()
    device = next(model.parameters()).device
    with torch.inference_mode():
        fresh = model(input_ids=tokens.unsqueeze(0).to(device), use_cache=False).logits[0].argmax(-1)
        final = hidden_states[:, -1].to(device=device, dtype=head.weight.dtype)
        projected = head(norm(final.unsqueeze(0)))[0].argmax(-1)
    return int((fresh == projected).sum()), int(tokens.numel())


def check_fidelity(run: Run, indices: list[int], files_ok: dict[int, bool]) -> dict:
    from safetensors.torch import load_file

    from specops.pipeline.extract_hf import choose_device, load_target

    device, dtype = choose_device(run.config.dtype)
    model = load_target(run, device, dtype)
    per_sample, matched, total = [], 0, 0
    for index in indices:
        if not files_ok.get(index, True):
            per_sample.append({"index": index, "skipped": "file failed the file checks"})
            continue
        tensors = load_file(str(file_for(run.paths.hidden_states, index)))
        hits, positions = agreement(model, tensors["token_ids"], tensors["hidden_states"])
        matched, total = matched + hits, total + positions
        per_sample.append({"index": index, "agreement": round(hits / positions, 4), "positions": positions})
    rate = matched / total if total else 0.0
    return {"ok": total > 0 and rate >= FIDELITY_THRESHOLD,
            "detail": {"agreement": round(rate, 4), "threshold": FIDELITY_THRESHOLD, "samples": per_sample}}


def validate(run: Run, fidelity_samples: int) -> dict[str, Any]:
    import datasets

    from specops.pipeline.config import config_hash
    from specops.pipeline.extract_hf import hidden_size
    from specops.pipeline.manifest import Manifest

    manifest = Manifest(run.paths.run_dir)
    extract_record = manifest.record("extract")
    if not extract_record or extract_record.get("status") != "done":
        raise BadInput(f"{run.label}: nothing extracted yet for run {run.paths.name}: run `step extract` first")
    count = int(extract_record["counts"]["samples"])
    layer_ids = extract_record["inputs"]["layer_ids"]
    dtype = extract_record["inputs"]["dtype"]
    dataset = datasets.load_from_disk(str(run.paths.prepared)).with_format(None)

    print(f"validate: checking {count} hidden-state files", file=sys.stderr)
    checks: dict[str, dict] = {}
    checks["files"] = check_files(run, dataset, count, layer_ids, hidden_size(run), dtype)
    bad = {int(p["file"][3:-12]) for p in checks["files"]["detail"]["problems"]}
    indices = fidelity_indices(count, fidelity_samples)
    print(f"validate: fidelity on rows {indices}", file=sys.stderr)
    checks["fidelity"] = check_fidelity(run, indices, {i: i not in bad for i in indices})
    ok = all(check["ok"] for check in checks.values())

    inputs = {"extract": extract_record["inputs_hash"], "samples": count, "fidelity_samples": fidelity_samples}
    started = manifest.begin("validate", config_hash(inputs), inputs)
    manifest.finish("validate", started, {"files": count, "fidelity_rows": len(indices)},
                    status="done" if ok else "failed")
    document = {"ok": ok, "step": "validate", "checks": checks}
    atomic.write_json(run.paths.validate_report, document)
    return document
