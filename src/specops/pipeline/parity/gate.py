"""The parity gate: before the first training step and before every evaluation, the draft's config read the
way the installed vLLM reads it, against what training used. A mismatch is one line, exit 1.

    before_training(run, plan, settings)   whether this host's vLLM can serve the draft beside the target at all
                                       (the run's settings: the attention backends' KV cache blocks, read
                                       from its files; asked to serve it and it cannot: one line, before any
                                       load); speculators' own `train --dry-run` (the same command, another
                                       save path) writes the draft config training will write; checked, then,
                                       where it is cheap (the settings' parity_serve: a serve env and a GPU
                                       host, or vLLM serving the run), one real request through the serving
                                       path with that untrained draft; its failure stops the run
    before_evaluation(run, folder, settings)  the checkpoint to be evaluated, checked the same way

The report goes to <run>/parity/report.json (the last gate) and into the step's document.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specops.contract.errors import CheckFailed
from specops.contract.progress import speaker
from specops.doctor import EVALUATE_ANYWAY
from specops.host import atomic
from specops.pipeline.parity import checks, draft
from specops.pipeline.parity.vllm_reading import VllmReading, read_vllm

if TYPE_CHECKING:
    from specops.pipeline.run import EffectiveSettings, Run
    from specops.pipeline.training import TrainPlan

PARITY_DIR = "parity"
REPORT_FILE = "report.json"
TRAINING_REPORT_FILE = "before-training.json"
DRY_RUN_DIR = "untrained"
DRY_RUN_RECORD = "dry_run.json"
SERVED_RECORD = "served.json"
def served_method(kind: str) -> str | None:
    """The speculative method specops serves a kind under (the vllm room's speculative_config); None: not served."""
    from specops.pipeline.vllm import served_method as method_of

    return method_of(kind)



def failure_line(output: str) -> str:
    """What a failed command said, on one line: its exception's own line ("FileNotFoundError: ..."), not the
    frame of a rich traceback box; else its last plain lines."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    plain = [line for line in lines if not line.startswith(("│", "╭", "╰", "┃"))]
    errors = [line for line in plain if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b.*:", line)]
    return errors[-1] if errors else " | ".join(plain[-3:])

say = speaker("parity")


def parity_dir(run: Run) -> Path:
    return run.paths.run_dir / PARITY_DIR


def trained_with(run: Run, d2t: Path | None) -> checks.Trained:
    """What training uses: the layers extraction captured (the manifest's record), the target, the d2t file."""
    from specops.pipeline.run import Manifest, read_model_config, text_config

    layers = run.num_layers()
    extract = (Manifest(run.paths.run_dir).record("extract") or {}).get("inputs") or {}
    if extract.get("layer_ids"):
        backend = extract.get("backend", "hf")
        ids = checks.vllm_numbering(list(extract["layer_ids"]), backend)
        origin = f"the layers extraction captured ({backend} backend, manifest)"
    else:
        ids, origin = run.layer_ids(), "the run's layer_ids (no extraction recorded)"
    target = read_model_config(run.model_path)
    text = text_config(target)
    architectures = target.get("architectures") or []
    return checks.Trained(speculator_type=run.config.draft.method,
                          aux_layers=ids[:-1] if ids and ids[-1] == layers else ids, aux_origin=origin,
                          target_layers=layers, target_vocab=text.get("vocab_size"),
                          draft_vocab=draft.npy_length(d2t) if d2t is not None else None,
                          architecture=architectures[0] if architectures else None,
                          extracted_by=extract.get("backend") if extract.get("layer_ids") else None,
                          final_layer=bool(ids) and ids[-1] == layers)


def check_folder(run: Run, folder: Path, trained: checks.Trained, reading: VllmReading | None) -> dict[str, Any]:
    """The parity rows of one draft folder; CheckFailed naming the first mismatch."""
    from specops.doctor import eagle3_support
    from specops.pipeline.vllm import draft_config

    support = (eagle3_support(reading.search_path, trained.architecture)
               if reading is not None and trained.architecture else None)
    rows = checks.compare(draft_config(folder), draft.tensor_shapes(folder), trained, reading,
                          served_method(trained.speculator_type), draft.speculators_defaults(trained.speculator_type),
                          support)
    if reading is not None and trained.architecture:
        from specops.analysis import ModuleIndex
        from specops.doctor import aux_capture

        rows += checks.capture_rows(trained, aux_capture(ModuleIndex(reading.search_path), trained.architecture),
                                    f"vLLM {reading.version}")
    bad = [row for row in rows if not row["ok"]]
    return {"draft": str(folder), "vllm": reading.version if reading else None,
            "vllm_read": bool(reading), "rows": rows, "ok": not bad,
            "mismatch": checks.mismatch_line(bad[0]) if bad else None}


def _record(run: Run, document: dict[str, Any]) -> None:
    """report.json: the last gate; before-training.json: the last gate before training (evaluations do not
    overwrite what the gate found before training: its served request among it)."""
    stamped = {**document, "at": time.time()}
    atomic.write_json(parity_dir(run) / REPORT_FILE, stamped)
    if document.get("when") == "before training":
        atomic.write_json(parity_dir(run) / TRAINING_REPORT_FILE, stamped)


def _refuse(run: Run, document: dict[str, Any], when: str) -> None:
    _record(run, document)
    for row in document["rows"]:
        if not row["ok"]:
            say(f"mismatch {checks.mismatch_line(row)}")
    raise CheckFailed(f"parity ({when}): {document['mismatch']}")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return document if isinstance(document, dict) else {}


def dry_run_draft(run: Run, plan: TrainPlan) -> Path:
    """speculators' `train --dry-run` with the training's own arguments into <run>/parity/untrained/: the
    config (and initial weights) training will write. Kept while the command and the versions are the same."""
    from specops.pipeline.run import package_versions
    from specops.pipeline.training import build_train_command, command

    out = parity_dir(run) / DRY_RUN_DIR
    # one process whatever the GPUs: the config does not depend on them; the save path is where it goes
    argv = [*build_train_command(replace(plan, save_path=Path("{save_path}"), epochs=1), 0), "--dry-run"]
    key = hashlib.sha256(json.dumps([argv, package_versions()]).encode()).hexdigest()[:16]
    record_file = parity_dir(run) / DRY_RUN_RECORD
    recorded = _read_json(record_file)
    if recorded.get("key") == key and (out / "config.json").is_file():
        return out

    def write(staging: Path) -> None:
        full = [command.resolve_executable(argv[0]), *(str(staging) if part == "{save_path}" else part
                                                       for part in argv[1:])]
        started = time.perf_counter()
        done = subprocess.run(full, capture_output=True, text=True, env=command.train_environment(),
                              stdin=subprocess.DEVNULL)
        if done.returncode != 0 or not (staging / "config.json").is_file():
            raise CheckFailed(f"parity: speculators train --dry-run failed (exit {done.returncode}): "
                              + failure_line(done.stdout + done.stderr))
        say(f"speculators train --dry-run wrote the untrained draft in {time.perf_counter() - started:.1f} s")

    atomic.replace_folder(out, write)
    atomic.write_json(record_file, {"key": key, "argv": argv})
    return out


def check_servable(run: Run, settings: EffectiveSettings, *, asked: bool = False,
                   when: str = "before training") -> None:
    """The served check where it costs nothing: a run that asks vLLM to serve its draft (evaluate.backend: vllm,
    parity.serve: true; `asked`: step parity --serve) on a host whose vLLM cannot serve it beside the target
    (the settings' reading of its attention backends) is refused, one line naming the setting that evaluates
    it anyway, before any load (the engine asks before its first step, the gate before the dry run)."""
    unservable = settings.draft_unservable
    if unservable and (asked or settings.serves_draft == "asked" or settings.evaluate_backend == "vllm"):
        document = {"when": when, "draft": None, "vllm": settings.vllm_version, "vllm_read": True, "rows": [],
                    "ok": False, "attention": settings.attention.to_dict(),
                    "mismatch": f"served: {unservable}; set {EVALUATE_ANYWAY} in {run.label} (the hf replay "
                                "evaluates the draft anyway) and leave parity.serve unset, or serve it on a GPU host"}
        _record(run, document)
        raise CheckFailed(f"parity ({when}, served): {document['mismatch']}")


def before_training(run: Run, plan: TrainPlan, settings: EffectiveSettings, *,
                    serve: bool | None = None) -> dict[str, Any]:
    """The gate before the first training step; CheckFailed (exit 1) on a mismatch, before anything trains.
    `settings`: the run's effective settings (pipeline.run.resolve): the serving vLLM, whether the served
    request runs (`serve` overrides it: step parity --serve/--no-serve) and whether this host can serve the
    draft at all (the attention backends' KV cache blocks, read from vLLM's files before any load)."""
    check_servable(run, settings, asked=serve is True)
    serve = settings.parity_serve if serve is None else serve
    unservable = settings.draft_unservable
    reading = read_vllm(search_path=settings.vllm_path)
    trained = trained_with(run, plan.d2t_path)
    untrained = dry_run_draft(run, plan)
    document = {"when": "before training", **check_folder(run, untrained, trained, reading)}
    if not document["ok"]:
        _refuse(run, document, "before training")
    if settings.attention is not None:
        document["attention"] = settings.attention.to_dict()
    # not asked: the served request is skipped, said (the evaluation uses the replay); the settings skip it too
    if unservable and (serve or settings.origins.get("parity_serve", "").startswith("skipped")):
        document["served"] = {"ok": None, "skipped": unservable}
        if serve:  # asked here (step parity --serve); the run's settings said it at the pipeline's start
            say(f"the served request is skipped: {unservable}")
    elif serve and reading is not None:
        from specops.pipeline.parity.live import one_request

        # a server load is minutes on a large target: the same untrained draft, vLLM and serve settings
        # served before are not served again
        served_key = hashlib.sha256(json.dumps([_read_json(parity_dir(run) / DRY_RUN_RECORD).get("key"),
                                                reading.version, list(run.config.vllm.serve_args),
                                                run.config.evaluate.num_speculative_tokens]).encode()).hexdigest()[:16]
        known = _read_json(parity_dir(run) / SERVED_RECORD)
        if known.get("key") == served_key and (known.get("served") or {}).get("ok"):
            document["served"] = {**known["served"], "reused": True}
        else:
            try:
                document["served"] = one_request(run, untrained, trained, reading)
            except CheckFailed as exc:  # the server did not start or answer: the draft cannot be served here
                document["served"] = {"ok": False, "why": f"the server with the untrained draft did not serve one "
                                                          f"request: {exc}"}
            atomic.write_json(parity_dir(run) / SERVED_RECORD, {"key": served_key, "served": document["served"]})
        if not document["served"]["ok"]:
            document["ok"], document["mismatch"] = False, document["served"]["why"]
            _refuse(run, document, "before training, served")
    say(_summary(document))
    _record(run, document)
    return document


def before_evaluation(run: Run, folder: Path, settings: EffectiveSettings) -> dict[str, Any]:
    """The gate before an evaluation, on the checkpoint to be evaluated; with the vllm backend on a host
    whose vLLM cannot serve the draft beside the target, one line naming the setting that evaluates it anyway."""
    from specops.pipeline.run import read_model_config, text_config
    from specops.pipeline.training import draft_vocab_size, vocab

    if settings.evaluate_backend == "vllm" and settings.draft_unservable:
        raise CheckFailed(f"parity (before evaluating {folder.name}): served: {settings.draft_unservable}; evaluate "
                          f"with the hf replay (--backend hf, or {EVALUATE_ANYWAY} in {run.label})")
    reading = read_vllm(search_path=settings.vllm_path)
    target_vocab = text_config(read_model_config(run.model_path)).get("vocab_size")
    d2t = vocab.outputs_in(run.paths.vocab, draft_vocab_size(run, target_vocab)).d2t if target_vocab else None
    trained = trained_with(run, d2t if d2t is not None and d2t.is_file() else None)
    document = {"when": f"before evaluating {folder.name}", **check_folder(run, folder, trained, reading)}
    if not document["ok"]:
        _refuse(run, document, f"before evaluating {folder.name}")
    say(_summary(document))
    _record(run, document)
    return document


def _summary(document: dict[str, Any]) -> str:
    keys = [row["key"] for row in document["rows"]]
    served = document.get("served")
    return (f"{document['when']}: {len(keys)} keys agree with "
            f"{'vLLM ' + str(document['vllm']) if document['vllm_read'] else 'the config (no vLLM here to read)'}"
            + ("; the served request skipped: this host's vLLM cannot serve the draft" if served and
               served.get("skipped") else f"; one request served with the untrained draft: {served['num_drafts']} "
               "drafts" + (" (served before, same draft and vLLM)" if served.get("reused") else "") if served else ""))
