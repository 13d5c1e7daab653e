"""The prepared rows counted and read without datasets or torch (specops.pipeline.data.saved).

A dataset saved in torch format, as speculators' prepare-data saves it, in one Arrow file or several;
what pyarrow reads is what `datasets.load_from_disk` reads, and a folder that is not a plain save goes
to datasets, which names what is wrong.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import datasets
import pytest

from specops.pipeline.data import saved

LENGTHS = [7, 3, 12, 5, 9, 1, 4]


def save(folder: Path, shards: int) -> Path:
    rows = {"input_ids": [list(range(n)) for n in LENGTHS], "seq_len": LENGTHS}
    datasets.Dataset.from_dict(rows).with_format("torch").save_to_disk(str(folder), num_shards=shards)
    return folder


@pytest.mark.parametrize("shards", [1, 3])
def test_rows_and_a_column_are_what_datasets_reads(tmp_path: Path, shards: int) -> None:
    folder = save(tmp_path / "prepared", shards)
    assert len(json.loads((folder / "state.json").read_text())["_data_files"]) == shards
    loaded = datasets.load_from_disk(str(folder)).with_format(None)
    assert saved.row_count(folder) == loaded.num_rows == len(LENGTHS)
    assert saved.column(folder, "seq_len") == list(loaded["seq_len"]) == LENGTHS


def test_counting_imports_neither_datasets_nor_torch(tmp_path: Path) -> None:
    folder = save(tmp_path / "prepared", 2)
    probe = ("import json, sys; from pathlib import Path; from specops.pipeline.data import saved; "
             f"print(json.dumps([saved.row_count(Path({str(folder)!r})), "
             f"saved.column(Path({str(folder)!r}), 'seq_len'), sorted(sys.modules)]))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    count, lengths, modules = json.loads(done.stdout)
    assert (count, lengths) == (len(LENGTHS), LENGTHS)
    assert "datasets" not in modules and "torch" not in modules


def test_a_folder_that_is_no_plain_save_goes_to_datasets_and_its_error(tmp_path: Path) -> None:
    folder = save(tmp_path / "prepared", 1)
    (folder / "data-00000-of-00001.arrow").write_bytes(b"not arrow at all")
    import pyarrow

    with pytest.raises(pyarrow.ArrowInvalid):  # raised by datasets' own load, after ours gave up
        saved.row_count(folder)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError):
        saved.column(empty, "seq_len")
