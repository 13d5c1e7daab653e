"""What a model load would find, found by the doctor first: the seed story (speculators 0.3.0 with
vLLM 0.16.0 and a Kimi-K2.5-shaped target), no false alarm on 0.4.0.1, import-time failures with
their frame, and a cache that answers the second time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from specops.analysis import ModuleIndex
from specops.cli import main
from specops.doctor import _import_probe

KIMI = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
        "text_config": {"num_hidden_layers": 61, "hidden_size": 7168, "vocab_size": 163840}}
KIMI_TOKENIZER = {"auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
                  "chat_template": "{{ messages }}"}


def doctor(capsys: pytest.CaptureFixture[str], *args: str, run: dict | None = None) -> tuple[int, dict]:
    code = main(["doctor", *args] + (["--run-json", json.dumps(run)] if run is not None else []))
    return code, json.loads(capsys.readouterr().out)


def kimi_model(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(KIMI))
    (root / "tokenizer_config.json").write_text(json.dumps(KIMI_TOKENIZER))
    return root


def problems(document: dict, result: str) -> dict[str, dict]:
    return {f["where"].rsplit("/", 1)[-1]: f for f in document["findings"] if f["result"] == result}


@pytest.mark.wheels
def test_the_six_seed_breaks_of_speculators_030_on_vllm_016_for_a_kimi_run(
        capsys: pytest.CaptureFixture[str], site_030: Path, tmp_path: Path) -> None:
    run = {"model_path": str(kimi_model(tmp_path / "kimi")), "trust_remote_code": True}
    code, document = doctor(capsys, "--site", str(site_030), "--no-import", run=run)

    assert code == 1
    errors = problems(document, "error")
    generator, worker = "vllm_hidden_states_generator.py", "custom_worker.py"
    assert "unexpected keyword 'kv_cache_specs'" in errors[f"{generator}:136"]["why"]
    assert "missing required parameter 'block_size'" in errors[f"{generator}:148"]["why"]
    assert "missing required parameter 'is_encoder_decoder'" in errors[f"{generator}:194"]["why"]
    tokenizer = errors[f"{generator}:84"]
    assert tokenizer["check"] == "model" and "loads the tokenizer without trust_remote_code" in tokenizer["why"]
    wrapper = errors[f"{worker}:107"]
    assert "KimiK25ForConditionalGeneration" in wrapper["why"] and "has no attribute 'model'" in wrapper["why"]
    assert "keeps it at language_model.model (DeepseekV2Model" in wrapper["why"]
    rename = errors[f"{worker}:30"]
    assert rename["check"] == "api" and "DeepseekV2Model" in rename["why"]
    assert "has no attribute 'get_input_embeddings'" in rename["why"]
    assert "renamed with the same signature? embed_input_ids" in rename["why"]
    assert all(errors[key]["fix"] for key in (f"{generator}:136", f"{worker}:30", f"{worker}:107"))
    # beyond the seed: the hand-driven loop skips the executor's sample_tokens step of vLLM 0.16
    assert "never calls sample_tokens" in errors[f"{generator}:253"]["why"]


@pytest.mark.wheels
def test_speculators_0401_on_vllm_016_is_clean_without_a_run(capsys: pytest.CaptureFixture[str],
                                                           site_0401: Path) -> None:
    code, document = doctor(capsys, "--site", str(site_0401), "--no-import")

    assert code == 0 and document["ok"] is True
    assert problems(document, "error") == {}
    summary = next(f for f in document["findings"] if "on vLLM instances bind" in f["why"])
    assert "LlamaForCausalLM" in summary["why"] and "DeepseekV3ForCausalLM" in summary["why"]


@pytest.mark.wheels
def test_speculators_0401_reaches_the_wrapped_decoder_of_a_kimi_run(capsys: pytest.CaptureFixture[str],
                                                                  site_0401: Path, tmp_path: Path) -> None:
    run = {"model_path": str(kimi_model(tmp_path / "kimi")), "trust_remote_code": True}
    _, document = doctor(capsys, "--site", str(site_0401), "--no-import", "--checks", "api,model", run=run)

    assert not [f for f in document["findings"] if "model.language_model.model" in f["why"]]
    assert any(f["result"] == "ok" and "reaches this architecture's decoder" in f["why"]
               for f in document["findings"])
    # its generator still loads the tokenizer without trust_remote_code, at its real line
    assert problems(document, "error")["vllm_hidden_states_generator.py:90"]["check"] == "model"


def planted(root: Path, body: str) -> Path:
    """A throwaway `speculators` whose import fails (or hangs) in its own file."""
    package = root / "speculators"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from speculators.models import registry\n")
    (package / "models.py").write_text(textwrap.dedent(body))
    return root


def test_an_import_failure_is_reported_with_the_deepest_frame_in_the_package(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    site = planted(tmp_path / "site", """
        import os


        def build():
            raise RuntimeError("planted; GPUs " + repr(os.environ.get("CUDA_VISIBLE_DEVICES")))


        registry = build()
    """)
    code, document = doctor(capsys, "--site", str(site), "--checks", "import")

    assert code == 1
    [failure] = [f for f in document["findings"] if f["check"] == "import"]
    assert failure["result"] == "error"
    assert failure["where"] == f"{site / 'speculators' / 'models.py'}:6"
    assert "import speculators fails: RuntimeError: planted; GPUs ''" in failure["why"]
    assert "deepest frame in its own files: build at models.py:6" in failure["why"]

    _, skipped = doctor(capsys, "--site", str(site), "--checks", "import", "--no-import")
    assert [f for f in skipped["findings"] if f["check"] == "import"] == []


def test_an_import_that_hangs_is_cut_off_and_unknown(tmp_path: Path) -> None:
    site = planted(tmp_path / "site", "import time\ntime.sleep(60)\nregistry = None\n")
    index = ModuleIndex([str(site)])

    running = _import_probe.start(index, [str(site)], timeout=2)
    [item] = _import_probe.items(running, {})

    assert item.result == "unknown" and "did not finish within 2 s" in item.why


def test_the_second_run_answers_from_the_cache_until_a_file_changes(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "speculators").mkdir(parents=True)
    module = site / "speculators" / "__init__.py"
    module.write_text("import json\n\n\ndef dump(x):\n    return json.dumps(x)\n")

    _, first = doctor(capsys, "--site", str(site), "--checks", "api,import")
    _, second = doctor(capsys, "--site", str(site), "--checks", "api,import")
    module.write_text("import json\n\n\ndef dump(x):\n    return json.dumps(x, indent=1)\n")
    _, third = doctor(capsys, "--site", str(site), "--checks", "api,import")

    assert first["cache"] == {"api": False, "import": False}
    assert second["cache"] == {"api": True, "import": True}
    assert second["findings"] == first["findings"]
    assert third["cache"] == {"api": False, "import": False}

    (site / "speculators" / "extra.py").write_text("X = 1\n")  # a module appears: imports may now resolve
    _, fourth = doctor(capsys, "--site", str(site), "--checks", "api,import")
    assert fourth["cache"] == {"api": False, "import": False}


@pytest.mark.wheels
@pytest.mark.slow  # long: scheduled among the first (tests/support/workers.py)
def test_the_probe_says_what_a_plain_import_of_the_real_package_says(site_030: Path) -> None:
    plain = subprocess.run([sys.executable, "-c", "import speculators"], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(site_030), "CUDA_VISIBLE_DEVICES": ""},
                           timeout=300)
    index = ModuleIndex([str(site_030), *sys.path])
    [item] = _import_probe.items(_import_probe.start(index, [str(site_030), *sys.path]), {"speculators": "0.3.0"})

    if plain.returncode == 0:
        assert item.result == "ok", item
    else:  # with this interpreter's pydantic 2.14: PydanticUndefinedAnnotation, raised in speculators' own code
        last = plain.stderr.strip().splitlines()[-1]
        assert item.result == "error" and last.split(":")[0].rsplit(".", 1)[-1] in item.why, (item, last)
        assert item.where.startswith(str(site_030 / "speculators"))
