"""A kind of draft other than EAGLE-3 end to end (issue 52): `draft.method: dflash` on the tiny training inputs,
trained by speculators' own trainer on CPU (one epoch), judged by the parity gate against the serve env's vLLM
before it trains, evaluated "vLLM only" where the hf replay cannot draft like it, and served by the real vLLM CPU
server in the form speculators wrote it.

The inputs are tests/support/tiny_training.py's (48 rows), as in test_train_cpu.py; the serve env (.venv-vllm) is
read for the gate and started once, for the served request.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.support.agent import REPO, run_agent
from tests.support.tiny_training import AUX_LAYER_IDS, TinyHost, patched_host
from tests.support.vllm import VLLM_PYTHON, free_port, in_vllm_worker, needs_vllm

pytestmark = [pytest.mark.slow, pytest.mark.wheels, needs_vllm, in_vllm_worker]

SERVE_ENV = {"SPECOPS_SERVE_PYTHON": str(VLLM_PYTHON), "VLLM_CPU_KVCACHE_SPACE": "1"}
BLOCK = 4  # drafts BLOCK - 1 = 3 tokens a step


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> TinyHost:
    return patched_host(tmp_path_factory.mktemp("kinds-host"))


def agent(host: TinyHost, *args: str, timeout: float = 600) -> tuple[int, dict, str]:
    return run_agent(host.workdir, *args, sites=(host.site,), env=SERVE_ENV, timeout=timeout)


@pytest.fixture(scope="module")
def trained(host: TinyHost) -> tuple[Path, dict]:
    run_dir = host.add_run("dflash", epochs=1)
    config_file = host.workdir / "runs" / "dflash.yaml"
    config = yaml.safe_load(config_file.read_text())
    config["draft"].update(method="dflash", block_size=BLOCK, num_layers=1)
    # DFlash embeds a mask token: the tiny tokenizer's special tokens may get ids past the model's 512 (its word
    # list holds their ids already), and speculators' fallback (the pad token) would then index out of range
    config["train"]["extra_args"] += ["--mask-token-id", "3"]
    config["vllm"] = {"port": free_port(), "serve_args": ["--max-model-len", "512"]}
    config_file.write_text(yaml.safe_dump(config))
    code, document, stderr = agent(host, "step", "train", "--run", "dflash")
    assert code == 0 and document["status"] == "done", stderr[-4000:]
    return run_dir, document


def test_dflash_is_trained_by_speculators_with_its_own_flags_in_the_form_vllm_loads(trained: tuple[Path, dict]) -> None:
    run_dir, document = trained
    command = document["command"]
    assert command[command.index("--speculator-type") + 1] == "dflash"
    assert command[command.index("--block-size") + 1] == str(BLOCK)
    config = json.loads((run_dir / "checkpoints" / "0" / "config.json").read_text())
    assert config["speculators_model_type"] == "dflash" and config["block_size"] == BLOCK
    assert config["aux_hidden_state_layer_ids"] == list(AUX_LAYER_IDS)  # the layers extraction captured
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == BLOCK - 1
    assert config["draft_vocab_size"] == 256  # the vocab step's d2t/t2d, as for EAGLE-3
    # the parity gate read the serve env's vLLM before anything trained: the kind, its method, its layers
    parity = document["parity"]
    assert parity["ok"] and parity["vllm"] == "0.32.0"
    rows = {row["key"]: row for row in parity["rows"]}
    assert (rows["speculators_model_type"]["training"], rows["speculators_model_type"]["serving"]) == ("dflash",) * 2
    assert (rows["method"]["training"], rows["method"]["serving"]) == ("dflash", "dflash")
    assert rows["eagle_aux_hidden_state_layer_ids"]["serving"] == list(AUX_LAYER_IDS)


def test_the_untrained_floor_of_a_dflash_draft_is_a_dflash_draft(trained: tuple[Path, dict], tmp_path: Path) -> None:
    """vLLM's evaluation serves the untrained draft beside the trained one: it must be of the trained draft's own
    kind, with its vocabulary mapping (an EAGLE-3 config read from a DFlash checkpoint failed the evaluate step)."""
    from safetensors.torch import load_file

    from specops.pipeline.evaluation.drafts import untrained_draft

    run_dir, _ = trained
    checkpoint = run_dir / "checkpoints" / "0"
    target = Path(json.loads((checkpoint / "config.json").read_text())["speculators_config"]["verifier"]
                  ["name_or_path"])
    folder = untrained_draft(checkpoint, target, tmp_path / "untrained")
    config = json.loads((folder / "config.json").read_text())
    assert config["speculators_model_type"] == "dflash" and config["block_size"] == BLOCK
    untrained, trained_weights = load_file(str(folder / "model.safetensors")), load_file(
        str(checkpoint / "model.safetensors"))
    assert bool((untrained["d2t"] == trained_weights["d2t"]).all())  # the same draft vocabulary
    assert untrained.keys() == trained_weights.keys()


def test_without_vllm_a_dflash_draft_is_evaluated_vllm_only_never_by_the_replay(
        host: TinyHost, trained: tuple[Path, dict]) -> None:
    code, document, stderr = agent(host, "step", "evaluate", "--run", "dflash", "--backend", "hf")
    assert code == 0, stderr[-3000:]
    assert document["status"] == "vLLM only" and document["report"]["mean_acceptance_length"] is None
    assert document["vllm_only"].startswith("vLLM only: a dflash draft is evaluated through vLLM's server")


# The trained draft served the way evaluate serves a draft of any kind: the run's generating server with
# speculative_config's --speculative-config (method dflash, the block's 3 tokens), one completion in the tiny
# tokenizer's own words, and the server's spec-decode counters.
_SERVE = """
import json, re, sys, urllib.request
from pathlib import Path
from specops.pipeline.run import Run
from specops.pipeline.vllm import generating_server, speculative_config, stop_generating_server
run = Run("dflash", sys.argv[1])
speculative = speculative_config(Path(sys.argv[2]))
server = generating_server(run, speculative=speculative)
try:
    body = json.dumps({"model": server["model"], "prompt": "t5 t6 t7 t8 t9", "max_tokens": 24,
                       "temperature": 0.0}).encode()
    request = urllib.request.Request(server["endpoint"] + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    text = json.loads(urllib.request.urlopen(request, timeout=600).read())["choices"][0]["text"]
    metrics = urllib.request.urlopen(server["endpoint"] + "/metrics", timeout=60).read().decode()
    drafts = sum(float(m.group(1)) for m in re.finditer(r"^vllm:spec_decode_num_draft_tokens_total[^ ]* (\\S+)$",
                                                         metrics, re.M))
finally:
    stop_generating_server(server, "the test's request is done")
print(json.dumps({"speculative": speculative, "text": text, "draft_tokens": drafts,
                  "version": server.get("vllm_version")}))
"""


@pytest.mark.vllm
def test_the_real_vllm_cpu_server_drafts_with_the_trained_dflash_draft(host: TinyHost, trained: tuple[Path, dict],
                                                                      patched_vllm: dict) -> None:
    import subprocess

    from testing.agent import agent_env, one_document

    run_dir, _ = trained
    checkpoint = run_dir / "checkpoints" / "0"
    done = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-c", _SERVE, str(host.workdir), str(checkpoint)],
                          cwd=host.workdir, env=agent_env(host.workdir, sites=(host.site,), extra=SERVE_ENV),
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    served = one_document(done.stdout, done.stderr)
    assert served["speculative"] == {"method": "dflash", "model": str(checkpoint), "num_speculative_tokens": BLOCK - 1}
    assert served["version"] == "0.32.0" and served["text"].split()
    assert served["draft_tokens"] > 0  # vLLM drafted with it: the checkpoint is in the form it loads
