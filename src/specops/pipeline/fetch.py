"""What `invoke fetch` brings home (`fetch-list --run NAME`): a consistent snapshot, with sizes and hashes.

Training may be running while a fetch happens: the trainer rewrites a checkpoint folder (a mid-epoch
save, then the epoch's end, into the same folder), appends to train.log and moves checkpoint_best. So
fetch-list never lists the live files. It copies them into a snapshot folder on the host,
runs/<run>/fetch/<id>/, that nothing else writes, hashes the copies and lists those; the workstation
downloads and checks them, then drops the snapshot (`fetch-list --run NAME --drop ID`).

- The checkpoint is the newest FINISHED one: speculators makes its `epoch<N>_end` (or `epoch<N>_step<K>`)
  link only after the model, optimizer, scheduler and training state are written. Its files are
  copied, then checked unchanged (size, mtime, inode, the link still there); a rewrite during the
  copy is retried. Optimizer and scheduler state only with --with-training-state.
- Growing logs (train.log) are copied up to the last whole line at a recorded offset.
- The metrics table and loss plot are computed from that copy of the log, so they match it; the
  validation report, manifest and vocab coverage (written atomically) are copied as they are, and so
  are the evaluation's report (as evaluation.json) and acceptance plot when the run was evaluated, and
  the last parity gate's rows (as parity.json), the last `evaluate --sweep` (sweep.json, sweep.png) and the last
  `evaluate --compare` (compare.json, compare.png).
"""

from __future__ import annotations

import re
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

from specops.contract.errors import BadInput, CheckFailed
from specops.contract.protocol import name_problem, stays_inside
from specops.host import atomic
from specops.pipeline.run import Run, file_sha256
from specops.pipeline.training import command as train
from specops.pipeline.training import metrics_report

TRAINING_STATE = ("optimizer_state_dict.pt", "scheduler_state_dict.pt")
SNAPSHOTS = "fetch"
_FINISHED_LINK = re.compile(r"epoch(\d+)_(end|step(\d+))")
_ATTEMPTS = 5
_WRITTEN_AFTER_THE_LINK = ("val_metrics.json",)  # the validation pass ends after the save
_STALE_SNAPSHOT_S = 24 * 3600  # a fetch that died left its snapshot: cleared by a later fetch


def finished_checkpoints(checkpoints: Path) -> list[tuple[int, str, Path]]:
    """(epoch, link name, folder) of every finished checkpoint, oldest first.

    Finished = a link speculators makes once a checkpoint is written (`epoch<N>_<end|stepK>`, or
    `checkpoint_best` when it saves only the best) points at folder N, the folder holds every
    checkpoint file, and none of them is newer than the link: the trainer rewrites folder N at the
    end of an epoch that had a mid-epoch save, and until it links it again that folder is unfinished.
    """
    found: dict[int, tuple[int, str, Path]] = {}
    if not checkpoints.is_dir():
        return []
    for link in sorted(checkpoints.iterdir()):
        match = _FINISHED_LINK.fullmatch(link.name)
        if not link.is_symlink() or not (match or link.name == "checkpoint_best"):
            continue
        folder = link.resolve()
        if folder.parent != checkpoints.resolve() or not folder.name.isdigit() or not train.is_complete(folder):
            continue
        if match and int(match.group(1)) != int(folder.name):
            continue
        linked_at = link.lstat().st_mtime_ns
        if any(path.stat().st_mtime_ns > linked_at for path in folder.iterdir()
               if path.is_file() and path.name not in _WRITTEN_AFTER_THE_LINK):
            continue
        epoch = int(folder.name)
        if epoch not in found or match:  # an epoch link names the checkpoint better than checkpoint_best
            found[epoch] = (epoch, link.name, checkpoints / folder.name)
    return [found[epoch] for epoch in sorted(found)]


def _signature(files: list[Path], link: Path) -> tuple[Any, ...]:
    """What changes when the trainer rewrites a checkpoint: its files' size, mtime and inode, and its link."""
    stats = []
    for path in files:
        stat = path.stat()
        stats.append((path.name, stat.st_size, stat.st_mtime_ns, stat.st_ino))
    return (tuple(stats), link.is_symlink() and (str(link.readlink()), link.lstat().st_mtime_ns))


def _copy_newest_finished(checkpoints: Path, into: Path, with_training_state: bool) -> tuple[int, str]:
    """Copy the newest finished checkpoint into `into`; (epoch, link). A checkpoint that changed while
    it was copied (the trainer rewrote it) is chosen again, from scratch."""
    for _attempt in range(_ATTEMPTS):
        finished = finished_checkpoints(checkpoints)
        if not finished:
            raise BadInput(f"{checkpoints}: no finished checkpoint yet: train first")
        epoch, link_name, folder = finished[-1]
        link = checkpoints / link_name
        files = sorted(path for path in folder.iterdir() if path.is_file()
                       and (with_training_state or path.name not in TRAINING_STATE))
        before = _signature(files, link)
        shutil.rmtree(into, ignore_errors=True)
        into.mkdir(parents=True)
        for path in files:
            shutil.copyfile(path, into / path.name)
        try:
            if _signature(files, link) == before:
                return epoch, link_name
        except FileNotFoundError:  # the trainer replaced a file while we copied it
            pass
        time.sleep(0.5)
    raise CheckFailed(f"{checkpoints}: the newest checkpoint kept changing during {_ATTEMPTS} copies; fetch again")


def copy_log_prefix(log: Path, into: Path) -> dict[str, int]:
    """Copy a growing log up to its last whole line now; the offset says how much was taken."""
    size = log.stat().st_size
    with log.open("rb") as handle:
        data = handle.read(size)
    offset = data.rfind(b"\n") + 1  # a line still being written waits for the next fetch
    atomic.write_bytes(into, data[:offset])
    return {"offset": offset, "size_at_snapshot": size}


def _clear_stale(root: Path) -> None:
    if not root.is_dir():
        return
    for old in root.iterdir():
        if old.is_dir() and time.time() - old.stat().st_mtime > _STALE_SNAPSHOT_S:
            shutil.rmtree(old, ignore_errors=True)


def _entry(path: Path, local_name: str) -> dict[str, Any]:
    return {"path": str(path), "name": local_name, "size": path.stat().st_size, "sha256": file_sha256(path)}


def fetch_list(run_name: str, with_training_state: bool) -> dict[str, Any]:
    run = Run(run_name)
    checkpoints = run.paths.checkpoints
    if not finished_checkpoints(checkpoints):  # before anything is written
        raise BadInput(f"{checkpoints}: no finished checkpoint yet for run {run_name}: train first")
    root = run.paths.run_dir / SNAPSHOTS
    _clear_stale(root)
    snapshot_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
    snapshot = root / snapshot_id
    snapshot.mkdir(parents=True)
    try:
        epoch, link_name = _copy_newest_finished(checkpoints, snapshot / "checkpoint", with_training_state)
        logs: dict[str, dict[str, int]] = {}
        log = checkpoints / train.LOG_FILE
        if log.is_file():
            logs[train.LOG_FILE] = copy_log_prefix(log, snapshot / train.LOG_FILE)
        report = metrics_report(run, log_path=snapshot / train.LOG_FILE, plot_path=snapshot / "loss.png")
        atomic.write_json(snapshot / "metrics.json", report)
        for extra in (run.paths.validate_report, run.paths.manifest, *sorted(run.paths.vocab.glob("*.json"))):
            if extra.is_file():
                shutil.copyfile(extra, snapshot / extra.name)
        # the evaluation's report and acceptance plot, when the run was evaluated, and the last sweep's and
        # comparison's (all written atomically)
        for extra, name in ((run.paths.evaluation / "report.json", "evaluation.json"),
                            (checkpoints / "acceptance.png", "acceptance.png"),
                            (run.paths.run_dir / "parity" / "report.json", "parity.json"),
                            (run.paths.evaluation / "sweep.json", "sweep.json"),
                            (checkpoints / "sweep.png", "sweep.png"),
                            (run.paths.evaluation / "compare.json", "compare.json"),
                            (run.paths.evaluation / "compare.png", "compare.png")):
            if extra.is_file():
                shutil.copyfile(extra, snapshot / name)
    except BaseException:
        shutil.rmtree(snapshot, ignore_errors=True)
        raise
    files = [_entry(path, f"checkpoint/{path.name}") for path in sorted((snapshot / "checkpoint").iterdir())]
    files += [_entry(path, path.name) for path in sorted(snapshot.iterdir()) if path.is_file()]
    best = checkpoints / "checkpoint_best"
    return {"ok": True, "run": run_name, "epoch": epoch, "checkpoint": link_name,
            "best_epoch": int(best.resolve().name) if best.is_symlink() and best.resolve().name.isdigit() else None,
            "snapshot": snapshot_id, "logs": logs, "files": files,
            "total_bytes": sum(entry["size"] for entry in files), "metrics": report["epochs"]}


def drop_snapshot(run_name: str, snapshot_id: str) -> dict[str, Any]:
    """Remove a snapshot the workstation has brought home (named by it: checked like any name)."""
    problem = name_problem(snapshot_id)
    if problem is not None or not stays_inside(f"{SNAPSHOTS}/{snapshot_id}"):
        raise BadInput(f"--drop: {problem or 'not inside the run'}")
    run = Run(run_name)
    shutil.rmtree(run.paths.run_dir / SNAPSHOTS / snapshot_id, ignore_errors=True)
    return {"ok": True, "run": run_name, "dropped": snapshot_id}
