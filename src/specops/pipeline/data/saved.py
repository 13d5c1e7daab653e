"""The rows of a dataset written by `datasets.save_to_disk`, counted and read with pyarrow alone.

Extract's plan needs the prepared rows' lengths and train's inputs their count. `datasets.load_from_disk`
imports datasets, and a dataset saved in torch format (speculators' prepare-data) imports torch for its
formatter: ~1.5 CPU s per call, on every step that only skips. The Arrow files the folder's state.json
lists hold the same rows; pyarrow reads them in milliseconds. A folder that is not what this expects
goes to datasets itself, which says what is wrong as it always did.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _arrow_files(folder: Path) -> list[Path] | None:
    """The Arrow files of the saved dataset, in order; None when the folder is not a plain save."""
    try:
        state = json.loads((folder / "state.json").read_text())
        names = [entry["filename"] for entry in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    files = [folder / name for name in names]
    if not files or state.get("_indices") or not all(file.is_file() for file in files):
        return None
    return files


def _read(files: list[Path]) -> list[Any]:
    """The files' tables, memory-mapped: nothing is copied until a column is converted."""
    import pyarrow as pa

    tables = []
    for file in files:
        with pa.memory_map(str(file)) as source:
            tables.append(pa.ipc.open_stream(source).read_all())
    return tables


def row_count(folder: Path) -> int:
    """Rows of the dataset saved in `folder`."""
    files = _arrow_files(folder)
    if files is not None:
        try:
            return sum(table.num_rows for table in _read(files))
        except Exception:  # not a stream pyarrow reads: datasets decides
            pass
    import datasets

    return datasets.load_from_disk(str(folder)).num_rows


def column(folder: Path, name: str) -> list[Any]:
    """One column of the dataset saved in `folder`, as Python values in row order."""
    files = _arrow_files(folder)
    if files is not None:
        try:
            return [value for table in _read(files) for value in table.column(name).to_pylist()]
        except Exception:  # no such column, or not a stream pyarrow reads: datasets decides
            pass
    import datasets

    return list(datasets.load_from_disk(str(folder)).with_format(None)[name])
