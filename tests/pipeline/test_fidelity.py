"""Fidelity by the final norm and LM head alone: exact logits, no whole model, honest "unknown"."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specops.pipeline.validation import Unsupported, check_fidelity, fidelity, load_projector, validate

from .conftest import copy_workdir, in_workdir

TOKENS = torch.tensor([[1, 4, 17, 99, 250, 3, 511, 42, 7, 300, 5, 64]])


def model_dir(root: Path) -> Path:
    return root / "models" / "tiny-llama"


def hf_logits_and_final(folder: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The hf model's logits and the residual stream entering its final norm (hidden_states[-1] is after it)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    captured = {}

    def keep(_module, args) -> None:
        captured["final"] = args[0][0].clone()

    model.model.norm.register_forward_pre_hook(keep)
    with torch.inference_mode():
        logits = model(input_ids=TOKENS, use_cache=False).logits[0]
    return logits, captured["final"]


def resave(source: Path, target: Path, **kwargs) -> Path:
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32)
    if kwargs.pop("tied", False):
        config = model.config
        config.tie_word_embeddings = True
        tied = LlamaForCausalLM(config)
        tied.load_state_dict(model.state_dict(), strict=False)
        tied.tie_weights()
        model = tied
    model.save_pretrained(str(target), **kwargs)
    return target


def strip_to(folder: Path, keep) -> int:
    """Rewrite every shard of folder with only the tensors `keep(name)` accepts; how many were dropped."""
    dropped = 0
    for shard in folder.glob("*.safetensors"):
        with safe_open(str(shard), framework="pt") as handle:
            names = list(handle.keys())
            kept = {name: handle.get_tensor(name) for name in names if keep(name)}
        dropped += len(names) - len(kept)
        save_file(kept, str(shard), metadata={"format": "pt"})
    return dropped


@pytest.fixture(scope="module")
def checkpoints(tiny_workdir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    single = model_dir(tiny_workdir)
    return {"single": single,
            "sharded": resave(single, root / "sharded", max_shard_size="100KB"),
            "tied": resave(single, root / "tied", tied=True)}


@pytest.mark.parametrize("kind", ["single", "sharded", "tied"])
def test_norm_and_head_alone_reproduce_the_hf_logits_exactly(checkpoints, kind):
    folder = checkpoints[kind]
    if kind == "sharded":
        assert (folder / "model.safetensors.index.json").is_file() and len(list(folder.glob("*.safetensors"))) > 3
    logits, final = hf_logits_and_final(folder)
    projector = load_projector(folder)
    assert projector.source["tensors_read"] == 2
    assert projector.source["head_kind"] == ("tied embedding" if kind == "tied" else "lm_head")
    assert torch.equal(projector.logits(final), logits)


def test_the_projection_never_needs_the_decoder_layers(checkpoints, tmp_path):
    folder = shutil.copytree(checkpoints["sharded"], tmp_path / "headless")
    logits, final = hf_logits_and_final(folder)
    dropped = strip_to(folder, lambda name: name in ("model.norm.weight", "lm_head.weight"))
    assert dropped > 30  # embeddings and every decoder layer are gone from the shards
    assert torch.equal(load_projector(folder).logits(final), logits)


def test_a_multimodal_wrapper_is_read_through_text_config(checkpoints, tmp_path):
    folder = shutil.copytree(checkpoints["single"], tmp_path / "wrapped")
    logits, final = hf_logits_and_final(folder)
    shard = folder / "model.safetensors"
    with safe_open(str(shard), framework="pt") as handle:
        tensors = {name: handle.get_tensor(name) for name in ("model.norm.weight", "lm_head.weight")}
    save_file({"model.language_model.norm.weight": tensors["model.norm.weight"],
               "lm_head.weight": tensors["lm_head.weight"]}, str(shard), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({"model_type": "llava", "text_config": config}))
    projector = load_projector(folder)
    assert projector.source["norm"] == "model.language_model.norm.weight"
    assert torch.equal(projector.logits(final), logits)


def edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("damage, reason", [
    (lambda f: (f / "model.safetensors").unlink(), "no model.safetensors"),
    (lambda f: edit_config(f, rms_norm_eps=None), "epsilon is unknown"),
    (lambda f: edit_config(f, model_type="gemma2"), "not a plain RMSNorm"),
    (lambda f: strip_to(f, lambda name: name != "lm_head.weight"), "no LM head"),
    (lambda f: strip_to(f, lambda name: name != "model.norm.weight"), "no final norm"),
])
def test_unsupported_checkpoints_say_why(checkpoints, tmp_path, damage, reason):
    folder = shutil.copytree(checkpoints["single"], tmp_path / "bad")
    damage(folder)
    with pytest.raises(Unsupported, match=reason):
        load_projector(folder)


def test_validate_reports_unknown_never_ok(extracted, tmp_path):
    root = copy_workdir(extracted, tmp_path / "w")
    run = in_workdir(root)
    no_server = check_fidelity(run, [0], {0: True}, "vllm", run_backend="hf")
    assert no_server["ok"] is False and no_server["detail"]["status"] == "unknown"
    assert "no running vllm-server job" in no_server["detail"]["reason"] and no_server["detail"]["reference"] == "vllm"
    dead = check_fidelity(run, [0], {0: True}, "vllm", endpoint="http://127.0.0.1:9/v1", run_backend="hf")
    assert dead["ok"] is False and dead["detail"]["status"] == "unknown"
    assert "does not answer" in dead["detail"]["reason"]
    bogus = check_fidelity(run, [0], {0: True}, "magic", run_backend="hf")
    assert bogus["ok"] is False and bogus["detail"]["status"] == "unknown"
    skipped = check_fidelity(run, [0], {0: False}, "hf", run_backend="hf")
    assert skipped["ok"] is False and skipped["detail"]["status"] == "unknown"

    edit_config(run.model_path, model_type="gemma2")
    report = validate(run, 1, "hf", run_backend="hf")
    fidelity = report["checks"]["fidelity"]
    assert report["ok"] is False and fidelity["ok"] is False and fidelity["detail"]["status"] == "unknown"
    assert "not a plain RMSNorm" in fidelity["detail"]["reason"]


def test_auto_without_a_server_uses_hf(extracted, tmp_path):
    root = copy_workdir(extracted, tmp_path / "w")
    report = validate(in_workdir(root), 2, "auto", run_backend="hf")
    detail = report["checks"]["fidelity"]["detail"]
    assert report["ok"] is True and detail["reference"] == "hf" and detail["agreement"] == 1.0
    assert detail["projection"]["tensors_read"] == 2


# ---------------------------------------------------------------------------------------------
# bf16 at a reduced width: near-ties are not evidence either way


@pytest.fixture(scope="module")
def reduced_width():
    """A random Llama at the 1b shape's head layout, width 1024, 4 layers, the embedded vocab; rows of
    random tokens; the final-norm input (and the layer before) of two intact extractions in bf16: the
    fp32 forward's states stored in bf16 (another kernel's rounding) and a padded batch of the bf16
    forward."""
    from specops.pipeline.data import tiny
    from specops.pipeline.validation.fidelity import HfReference, Projector

    config = tiny.llama_config("1b", 512, hidden_size=1024, num_hidden_layers=4, intermediate_size=4096,
                               num_attention_heads=16, num_key_value_heads=4)
    # every matrix at 0.02: each layer moves the answers, so states of the wrong layer are wrong
    wide = tiny.random_llama(config, torch.device("cpu"), torch.float32, learnable=False)
    narrow = tiny.random_llama(config, torch.device("cpu"), torch.float32, learnable=False).to(torch.bfloat16)
    generator = torch.Generator().manual_seed(1)
    rows = [torch.randint(6, 512, (length,), generator=generator) for length in (300, 250, 200, 150)]

    def captured(model, batched: bool) -> list[torch.Tensor]:
        """[T, 2, hidden] per row: the last layer's input and the final norm's input."""
        seen: list[torch.Tensor] = []
        hooks = [model.model.layers[-1].register_forward_pre_hook(lambda _m, args: seen.append(args[0])),
                 model.model.norm.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))]
        with torch.inference_mode():
            if batched:
                ids = torch.zeros((len(rows), len(rows[0])), dtype=torch.long)
                mask = torch.zeros_like(ids)
                for i, row in enumerate(rows):
                    ids[i, :len(row)], mask[i, :len(row)] = row, 1
                model.model(input_ids=ids, attention_mask=mask)
                states = [torch.stack([seen[0][i, :len(row)], seen[1][i, :len(row)]], 1) for i, row in enumerate(rows)]
            else:
                states = []
                for row in rows:
                    seen.clear()
                    model.model(input_ids=row[None])
                    states.append(torch.stack([seen[0][0], seen[1][0]], 1))
        for hook in hooks:
            hook.remove()
        return [state.to(torch.bfloat16) for state in states]

    projector = Projector(narrow.model.norm.weight.detach(), narrow.lm_head.weight.detach(), config.rms_norm_eps)
    return {"rows": rows, "projector": projector, "reference": HfReference(narrow),
            "fp32 stored in bf16": captured(wide, False), "bf16 padded batch": captured(narrow, True)}


def compare(setup, states) -> fidelity.Agreement:
    total = fidelity.Agreement()
    for tokens, hidden in zip(setup["rows"], states, strict=True):
        total = total.add(fidelity.agreement(setup["projector"], setup["reference"], tokens, hidden))
    return total


@pytest.mark.parametrize("intact", ["fp32 stored in bf16", "bf16 padded batch"])
def test_in_bf16_intact_files_pass_at_every_decidable_position(reduced_width, intact):
    from specops.pipeline.validation.checks import MIN_DECIDABLE

    total = compare(reduced_width, reduced_width[intact])
    assert total.dtype == "bfloat16" and total.unit_roundoff == 2.0 ** -8
    assert total.decided_agreed == total.decidable >= max(MIN_DECIDABLE, 0.3 * total.positions)
    assert total.decidable < total.positions  # the near-ties were left out
    if intact == "fp32 stored in bf16":
        assert total.agreed / total.positions < 0.98  # the old fixed rate would have failed these files


@pytest.mark.parametrize("damage", ["shifted", "shuffled", "wrong layer"])
def test_in_bf16_misplaced_states_fail_at_the_decidable_positions(reduced_width, damage):
    from specops.pipeline.validation.checks import FIDELITY_THRESHOLD, MIN_DECIDABLE

    generator = torch.Generator().manual_seed(5)
    damaged = []
    for state in reduced_width["bf16 padded batch"]:
        if damage == "shifted":
            damaged.append(torch.cat([state[1:], state[-1:]]))
        elif damage == "shuffled":
            damaged.append(state[torch.randperm(len(state), generator=generator)])
        else:
            damaged.append(state.flip(1))  # the last layer's input where its output belongs
    total = compare(reduced_width, damaged)
    assert total.decidable >= MIN_DECIDABLE
    assert total.decided_agreed / total.decidable < min(0.5, FIDELITY_THRESHOLD)


def test_in_fp32_nearly_every_position_is_decidable(extracted, tmp_path):
    report = validate(in_workdir(copy_workdir(extracted, tmp_path / "w")), 2, "hf", run_backend="hf")
    detail = report["checks"]["fidelity"]["detail"]
    assert report["ok"] and detail["rule"]["dtype"] == "float32" and detail["agreement"] == 1.0
    assert detail["decidable"] >= 0.99 * detail["positions"] and detail["rule"]["tolerance_max"] < 1e-4


def test_too_few_decidable_positions_are_unknown_never_ok(extracted, tmp_path, monkeypatch):
    from specops.pipeline.validation import checks

    monkeypatch.setattr(checks, "MIN_DECIDABLE", 10 ** 6)
    report = check_fidelity(in_workdir(copy_workdir(extracted, tmp_path / "w")), [0], {0: True}, "hf", run_backend="hf")
    assert report["ok"] is False and report["detail"]["status"] == "unknown"
    assert "positions are decidable in float32" in report["detail"]["reason"]


def test_the_decision_is_the_same_whatever_the_chunks(reduced_width, monkeypatch):
    """The head is widened to fp32 a slice of the vocabulary at a time, positions a chunk at a time."""
    final = reduced_width["bf16 padded batch"][0][:, -1]
    whole = fidelity.decidable_choices(reduced_width["projector"], final)
    monkeypatch.setattr(fidelity, "VOCAB_CHUNK", 100)
    monkeypatch.setattr(fidelity, "ROW_CHUNK", 64)
    chunked = fidelity.decidable_choices(reduced_width["projector"], final)
    assert all(torch.equal(a, b) for a, b in zip(whole[:2], chunked[:2], strict=True))
    assert torch.allclose(whole[2], chunked[2], rtol=1e-5)
