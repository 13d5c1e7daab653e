"""speculators train with the Kimi-K2.5 wrapper as its verifier (`--verifier-name-or-path` on
KimiK25ForConditionalGeneration around a DeepSeek-V3 text model), real speculators 0.9.0 and transformers.

The wrapper's break in speculators, reproduced on the pristine wheel and fixed by the patch set
speculators-0.9.0-wrapper (a folder without a processor config is read through its tokenizer); the whole hf
pipeline on the wrapper as Kimi-K2.5 is published, its routed experts int4 compressed-tensors (the shared finished
Kimi run; issue 59): a trained draft well ahead of the untrained one, a draft config and verifier weights that are
the text model's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import finished_kimi as finished_run
from tests.support.agent import REPO, run_agent
from tests.support.finished import pipeline_log

SET = "speculators-0.9.0-wrapper"
MODEL = "models/tiny-kimi-k25"

LOAD = """
import json, sys
from speculators.data_generation import preprocessing
try:
    processor = preprocessing.load_processor(sys.argv[1], trust_remote_code=True)
except OSError as error:
    print(json.dumps({"error": str(error)}))
else:
    print(json.dumps({"class": type(processor).__name__, "pad": processor.pad_token,
                      "with_config": preprocessing._ships_processor_config(sys.argv[2])
                      if hasattr(preprocessing, "_ships_processor_config") else None}))
"""


def load_processor_in(site: Path, model: Path, with_config: Path) -> dict:
    """speculators' load_processor on `model`, speculators imported from `site` (transformers from this env)."""
    env = {**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", LOAD, str(model), str(with_config)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.wheels
@pytest.mark.slow
def test_the_wrappers_processor_break_on_the_pristine_wheel_is_fixed_by_the_patch_set(tmp_path: Path) -> None:
    from tests.support.wheels import site_with

    subprocess.run([sys.executable, "-m", "specops", "tiny", "--shape", "kimi"], check=True, capture_output=True,
                   cwd=tmp_path, env={**os.environ, "SPECOPS_WORKDIR": str(tmp_path)}, timeout=300)
    model = tmp_path / MODEL
    with_config = tmp_path / "with-processor-config"
    shutil.copytree(model, with_config)
    (with_config / "preprocessor_config.json").write_text("{}")
    site = site_with(tmp_path / "site", ("speculators", "0.9.0"))

    # as released: AutoProcessor builds kimi_k25's native processor and wants its image processor's files
    assert "Can't load image processor" in load_processor_in(site, model, with_config)["error"]

    code, document, stderr = run_agent(tmp_path, "patch", "apply", "--set", SET, "--patches-dir",
                                       str(REPO / "patches"), sites=(site,))
    assert code == 0 and document["sets"][0]["result"] == "applied", stderr[-2000:]
    code, document, stderr = run_agent(tmp_path, "patch", "verify", "--set", SET, "--patches-dir",
                                       str(REPO / "patches"), sites=(site,))
    assert code == 0 and all(check["ok"] for check in document["checks"]), document["checks"]

    # patched: the text model's remote-code tokenizer, its pad token set as speculators sets it; a folder
    # that ships a processor config still goes to AutoProcessor
    loaded = load_processor_in(site, model, with_config)
    assert loaded == {"class": "TikTokenTokenizer", "pad": "<|pad|>", "with_config": True}


@pytest.mark.slow
def test_the_published_int4_kimi_wrapper_runs_the_whole_hf_pipeline_and_its_draft_beats_the_untrained(
        finished_kimi: tuple[Path, dict]) -> None:
    import numpy as np
    import torch
    from safetensors import safe_open

    root, summary = finished_kimi
    assert summary["ok"] and summary["backend"] == "hf"
    assert all(not step["status"].startswith("fail") for step in summary["steps"].values()), summary["steps"]
    assert f"patch set {SET}: " in pipeline_log(finished_kimi)  # applied (or found applied) by the patches step

    trained, untrained = summary["evaluation"]["report"], summary["evaluation"]["untrained"]
    assert trained["backend"] == untrained["backend"] == "hf" and trained["prompts"] == 10
    assert trained["mean_acceptance_length"] >= untrained["mean_acceptance_length"] + 0.3, (trained, untrained)

    # the draft is for the text model and names the wrapper as its verifier (what vLLM serves)
    run = root / "runs" / finished_run.RUN
    checkpoint = run / "checkpoints" / trained["checkpoint"]
    config = json.loads((checkpoint / "config.json").read_text())
    published = root / finished_run.MODEL  # Kimi-K2.5 as published: its routed experts int4 (issue 59)
    text = json.loads((published / "config.json").read_text())["text_config"]
    assert json.loads((published / "config.json").read_text())["quantization_config"]["format"] == "pack-quantized"
    layer = config["transformer_layer_config"]
    assert (layer["hidden_size"], layer["vocab_size"]) == (text["hidden_size"], text["vocab_size"])
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert config["speculators_config"]["verifier"]["architectures"] == ["KimiK25ForConditionalGeneration"]

    # its frozen embedding and LM head are the text model's, found under `language_model.`
    t2d = torch.from_numpy(np.load(run / "vocab" / f"t2d-{config['draft_vocab_size']}.npy"))
    with safe_open(str(published / "model.safetensors"), "pt") as target, \
            safe_open(str(checkpoint / "model.safetensors"), "pt") as draft:
        embed = target.get_tensor("language_model.model.embed_tokens.weight")
        head = target.get_tensor("language_model.lm_head.weight")[t2d]
        assert torch.equal(draft.get_tensor("embed_tokens.weight"), embed.to(draft.get_tensor("fc.weight").dtype))
        assert torch.equal(draft.get_tensor("lm_head.weight"), head.to(draft.get_tensor("fc.weight").dtype))
