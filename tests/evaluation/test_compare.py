"""`evaluate --compare` without a server: the hf backend scores only what its replay drafts like (EAGLE-3) and
says "vLLM only" for the rest, a trained kind the run does not train is one line (exit 2), and the table's
speedups and best kind are computed from the rows as the document says."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from specops.pipeline.evaluation.compare import best_kinds, table_lines
from tests.evaluation.conftest import copy_of
from tests.support.agent import agent_env


def _compare(root, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specops", "step", "evaluate", "--run", "tiny", *flags],
                          cwd=root, env=agent_env(root), capture_output=True, text=True, timeout=600)


def test_the_hf_backend_scores_eagle3_by_the_replay_and_says_vllm_only_for_the_rest(evaluated, tmp_path) -> None:
    """eagle3@twin: the draft of another run on the same target (here a copy of the run: the same draft bytes)."""
    root = copy_of(evaluated, tmp_path / "w")
    shutil.copytree(root / "runs" / "tiny", root / "runs" / "twin", symlinks=True)
    shutil.copyfile(root / "runs" / "tiny.yaml", root / "runs" / "twin.yaml")
    (root / "mt.jsonl").write_text(json.dumps({"turns": ["Name three colours.", "Now three more."]}) + "\n")
    done = _compare(root, "--backend", "hf", "--compare", "none,ngram,eagle3,eagle3@twin", "--checkpoint", "last",
                    "--prompts", "2", "--set", "mt=mt.jsonl")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    compared = json.loads(done.stdout.strip().splitlines()[-1])["compare"]
    rows = {row["label"]: row for row in compared["rows"]}
    assert rows["none"]["unavailable"] == "vLLM only"
    assert rows["ngram"]["unavailable"].startswith("vLLM only: a training-free speculator has no hf replay")
    heldout = rows["eagle3"]["acceptance"]["heldout"]
    assert heldout["backend"] == "hf" and heldout["num_drafts"] > 0 and heldout["prompts"] == 2
    assert rows["eagle3"]["acceptance"]["mt"]["prompts"] == 2  # the set's two turns, replayed
    assert not rows["eagle3"]["speed"] and compared["servers"] == [] and compared["best"] == []
    twin = rows["eagle3@twin"]
    assert (twin["run"], rows["eagle3"]["run"]) == ("twin", "tiny") and "/runs/twin/checkpoints/" in twin["draft"]
    assert twin["acceptance"]["heldout"]["num_accepted_tokens"] == heldout["num_accepted_tokens"]  # the same bytes
    assert not (root / "logs").is_dir() or not list((root / "logs").glob("vllm-server-*"))  # no server started
    listed = subprocess.run([sys.executable, "-m", "specops", "fetch-list", "--run", "tiny"], cwd=root,
                            env=agent_env(root), capture_output=True, text=True, timeout=300)
    fetched = {entry["name"] for entry in json.loads(listed.stdout.strip().splitlines()[-1])["files"]}
    assert {"compare.json", "compare.png"} <= fetched, listed.stderr[-2000:]  # `invoke fetch` brings them home


def test_a_trained_kind_the_run_does_not_train_is_one_line(evaluated, tmp_path) -> None:
    root = copy_of(evaluated, tmp_path / "w")
    done = _compare(root, "--backend", "hf", "--compare", "none,dflash")
    assert done.returncode == 2, done.stderr[-2000:]
    document = json.loads(done.stdout.strip().splitlines()[-1])
    assert document["error"].startswith("--compare dflash: run tiny trains eagle3 drafts (draft.method)")
    assert "dflash@RUN" in document["error"]
    assert not (root / "runs" / "tiny" / "evaluation" / "compare.json").exists()  # nothing half-written


def test_suffix_is_compared_only_where_its_global_tree_can_be_turned_off() -> None:
    from specops.pipeline.evaluation.compare import SUFFIX_SETTINGS, training_free_config, unmeasurable

    assert training_free_config("suffix", 3) == {"method": "suffix", "num_speculative_tokens": 3, **SUFFIX_SETTINGS}
    fields = frozenset({"method", "num_speculative_tokens", *SUFFIX_SETTINGS})
    assert unmeasurable("suffix", fields) is None and unmeasurable("ngram", frozenset({"method"})) is None
    line = unmeasurable("suffix", frozenset({"method", "num_speculative_tokens"}))
    assert line is not None and line.startswith("not comparable here: this vLLM's SpeculativeConfig has no "
                                                "suffix_decoding_max_cached_requests")
    assert unmeasurable("suffix", frozenset()) is None  # not read: vLLM's own validation decides at the load


def test_the_task_renders_one_row_per_kind_and_names_the_best(capsys) -> None:
    from remote.tasks.pipeline_views import render_compare

    rows = [_row("none", {1: 100.0}), _row("eagle3", {1: 132.0}, 2.1),
            {"label": "suffix", "kind": "suffix", "unavailable": "not servable here: needs arctic_inference"}]
    render_compare({"backend": "vllm", "concurrency": [1], "sets": {}, "prompts": 20, "num_speculative_tokens": 2,
                    "max_tokens": 64, "rows": rows, "best": best_kinds(rows, [1]), "plot": "/w/compare.png"})
    out = capsys.readouterr().out
    assert "2.100 (0.50 / 0.25)" in out and "1.32x" in out and "needs arctic_inference" in out
    assert "best at concurrency 1: eagle3, 132.00 tokens/s (1.32x none), 32.0% ahead of none" in out


def _row(label: str, rates: dict[int, float], acceptance: float | None = None) -> dict:
    figures = {"heldout": {"mean_acceptance_length": acceptance, "per_position_acceptance": [0.5, 0.25]}} \
        if acceptance else {}
    return {"label": label, "kind": label, "unavailable": None, "acceptance": figures,
            "speed": [{"concurrency": c, "tokens_per_s": rate, "speedup": round(rate / {1: 100.0, 8: 400.0}[c], 3)}
                      for c, rate in rates.items()]}


def test_the_best_is_the_fastest_at_each_concurrency_with_its_margin_over_the_next() -> None:
    rows = [_row("none", {1: 100.0, 8: 400.0}), _row("ngram", {1: 110.0, 8: 300.0}, 1.8),
            _row("eagle3", {1: 132.0, 8: 380.0}, 2.1),
            {"label": "suffix", "kind": "suffix", "unavailable": "not servable here: needs arctic_inference"}]
    best = best_kinds(rows, [1, 8])
    assert best == [{"concurrency": 1, "label": "eagle3", "tokens_per_s": 132.0, "speedup": 1.32,
                     "runner_up": "ngram", "margin": 0.2},
                    {"concurrency": 8, "label": "none", "tokens_per_s": 400.0, "speedup": 1.0,
                     "runner_up": "eagle3", "margin": 0.0526}]
    lines = table_lines({"backend": "vllm", "concurrency": [1, 8], "sets": {}, "rows": rows, "best": best})
    assert lines[0].split() == ["kind", "heldout", "MAL", "(per", "position)", "tok/s", "c=1", "tok/s", "c=8",
                                "speedup", "c=1", "speedup", "c=8"]
    assert lines[3].split() == ["eagle3", "2.100", "(0.50", "/", "0.25)", "132.00", "380.00", "1.32x", "0.95x"]
    assert lines[4] == "suffix  not servable here: needs arctic_inference"  # one line, no number
    assert lines[5] == "best at concurrency 1: eagle3, 132.00 tokens/s (1.32x none), 20.0% ahead of ngram"
