"""Step 2, extract (hf): the capture convention, the files, resuming, and speculators reading them."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from specops.pipeline.extraction import file_for, verify_header
from tests.support.agent import run_agent as agent
from tests.support.agent import start_agent as agent_popen

from .conftest import copy_workdir, in_workdir


def hidden_state_files(root: Path) -> dict[str, bytes]:
    folder = root / "runs" / "tiny" / "hidden_states"
    return {path.name: path.read_bytes() for path in sorted(folder.glob("hs_*.safetensors"))}


@pytest.mark.slow  # long: scheduled among the first (tests/support/workers.py)
def test_end_to_end_prepare_extract_validate_through_the_agent(tiny_workdir, tmp_path):
    root = copy_workdir(tiny_workdir, tmp_path / "w")
    code, prepared, _ = agent(root, "step", "prepare", "--run", "tiny")
    assert (code, prepared["status"], prepared["counts"]["rows"]) == (0, "done", 200)

    code, extracted, stderr = agent(root, "step", "extract", "--run", "tiny", "--samples", "10")
    assert code == 0 and extracted["status"] == "done"
    assert extracted["counts"]["samples"] == 10 and extracted["layer_ids"] == [1, 2, 3, 4]
    assert len(hidden_state_files(root)) == 10
    assert "samples/s" in stderr and "tokens/s" in stderr and "ETA" in stderr
    progress = json.loads((root / "runs" / "tiny" / "hidden_states" / "progress.json").read_text())
    assert (progress["state"], progress["done"], progress["total"]) == ("done", 10, 10)

    code, validated, _ = agent(root, "step", "validate", "--run", "tiny", "--fidelity-samples", "3")
    assert code == 0 and validated["ok"] is True
    assert validated["checks"]["fidelity"]["detail"]["agreement"] >= 0.98
    manifest = json.loads((root / "runs" / "tiny" / "manifest.json").read_text())
    assert {"prepare", "extract", "validate"} <= set(manifest["steps"])
    import transformers

    assert manifest["steps"]["extract"]["versions"]["transformers"] == transformers.__version__
    assert manifest["steps"]["extract"]["counts"]["samples"] == 10


def test_layer_ids_are_the_states_entering_layers_and_the_final_one_is_before_the_norm(extracted):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(extracted / "models" / "tiny-llama"), dtype=torch.float32)
    saved = load_file(str(file_for(extracted / "runs" / "tiny" / "hidden_states", 0)))
    with torch.inference_mode():
        outputs = model(input_ids=saved["token_ids"].unsqueeze(0), output_hidden_states=True)
    reference = outputs.hidden_states  # [embeddings, after layer 0, ..., after last layer + final norm]
    captured = saved["hidden_states"]
    assert captured.shape == (saved["token_ids"].numel(), 4, 64)
    for slot, layer_id in enumerate([1, 2, 3]):  # entering layer i = leaving layer i-1
        torch.testing.assert_close(captured[:, slot], reference[layer_id][0], rtol=1e-4, atol=1e-4)
    final = captured[:, 3]
    assert not torch.allclose(final, reference[4][0], atol=1e-3)  # HF's last element is post-norm ...
    torch.testing.assert_close(model.model.norm(final), reference[4][0], rtol=1e-4, atol=1e-4)  # ... ours is pre


def test_files_load_through_speculators_own_training_data_pipeline(extracted):
    from hs_connectors import FileTransfer
    from speculators.data_generation.offline import check_hidden_states, find_corrupt_hidden_state_indices
    from speculators.train.data import ArrowDataset, CollateFn

    run_dir = extracted / "runs" / "tiny"
    hidden = run_dir / "hidden_states"
    assert find_corrupt_hidden_state_indices(hidden, list(range(40))) == {}
    dataset = ArrowDataset(max_len=256, datapath=str(run_dir / "prepared"), transfer=FileTransfer(hidden),
                           on_missing="raise", hidden_states_dtype=torch.float32)
    sample = dataset[7]
    assert sample["hidden_states"].shape[1] == 3 * 64  # the auxiliary layers, flattened
    assert sample["verifier_last_hidden_states"].shape[1] == 64
    check_hidden_states(FileTransfer(hidden).get_cached(7), sample["input_ids"].tolist())
    batch = CollateFn(256, 64, 3, torch.float32)([dataset[i] for i in range(3)])
    assert batch["hidden_states"].shape == (1, 256, 192) and batch["error_records"] == 0


def test_a_kill_during_extraction_leaves_whole_files_and_resume_gives_identical_bytes(prepared, extracted, tmp_path):
    root = copy_workdir(prepared, tmp_path / "w")
    folder = root / "runs" / "tiny" / "hidden_states"
    process = agent_popen(root, "step", "extract", "--run", "tiny", "--samples", "40")
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and process.poll() is None:
        if folder.is_dir() and len(list(folder.glob("hs_*.safetensors"))) >= 2:
            break
        time.sleep(0.005)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    process.stdout.close()
    process.stderr.close()
    survivors = list(folder.glob("hs_*.safetensors"))
    assert 2 <= len(survivors) < 40, "the kill must land in the middle of the extraction"
    import datasets

    lengths = datasets.load_from_disk(str(root / "runs" / "tiny" / "prepared")).with_format(None)["seq_len"]
    for path in survivors:
        index = int(path.name[3:-12])
        assert verify_header(path, lengths[index], 4, 64, "float32") is None

    code, document, _ = agent(root, "step", "extract", "--run", "tiny", "--samples", "40")
    assert code == 0 and document["counts"]["written"] == 40 - len(survivors)
    assert hidden_state_files(root) == hidden_state_files(extracted)
    assert not list(folder.glob(".hs_*"))


def test_resume_regenerates_a_truncated_file_and_skips_when_all_is_whole(extracted, tmp_path):
    from specops.pipeline.extraction.hf import extract

    root = copy_workdir(extracted, tmp_path / "w")
    damaged = file_for(root / "runs" / "tiny" / "hidden_states", 5)
    damaged.write_bytes(damaged.read_bytes()[:-100])
    report = extract(in_workdir(root), 40)
    assert report["counts"]["regenerated"] == 1 and report["counts"]["written"] == 1
    assert hidden_state_files(root) == hidden_state_files(extracted)
    assert extract(in_workdir(root), 40)["status"] == "skipped: unchanged"
    assert extract(in_workdir(root), 12)["status"] == "skipped: unchanged"


def test_extraction_reads_prepares_rows_and_never_runs_prepare(tiny_workdir, extracted, tmp_path):
    """The step table runs prepare before extract; the extraction room only reads what prepare wrote."""
    from specops.contract.errors import BadInput
    from specops.pipeline.extraction.hf import extract

    root = copy_workdir(tiny_workdir, tmp_path / "unprepared")
    with pytest.raises(BadInput, match="run the prepare step first"):
        extract(in_workdir(root), 4)
    assert not (root / "runs" / "tiny" / "prepared").exists()
    root = copy_workdir(extracted, tmp_path / "forty")
    with pytest.raises(BadInput, match="40 rows prepared, extract asks for 41"):
        extract(in_workdir(root), 41)
